"""Run each program in doc/examples/ in a fresh interpreter and check its output."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXAMPLES_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "doc", "examples"
)
# Each example is a handful of trivial tasks; 60 s only guards against a hang.
EXAMPLE_TIMEOUT_S = 60

# example file -> lines its stdout must contain, in this order.
EXPECTED = {
    "linear_data_passing.py": ["subtotal: 5.0", "total: 6.0"],
    "graph_flow.py": ["x + y = 25", "doubled = 50"],
    "retry_times.py": ["attempts: 3", "report: status=connected"],
    "revert_on_failure.py": [
        "flow failed: printer out of paper",
        "booked",
        "charged for seat-12A",
        # Reverted newest first: the charge is refunded before the seat is released.
        "refunded 120",
        "released seat-12A",
    ],
    # Persistence: the engine process is killed mid-'charge'; resumed here.
    "resume_after_crash.py": [
        "killed the engine process while 'charge' was running",
        "saved states: reserve=SUCCESS charge=RUNNING ship=PENDING",
        "resumed flow ended SUCCESS",
        "executions: reserve=1 charge=2 ship=1",
    ],
}


def test_every_example_is_checked():
    on_disk = {f for f in os.listdir(EXAMPLES_DIR) if f.endswith(".py")}
    assert on_disk == set(EXPECTED), "add new examples to EXPECTED (or remove stale ones)"


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name):
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES_DIR, name)],
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        cwd=EXAMPLES_DIR,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr}"
    lines = [line.strip() for line in proc.stdout.splitlines()]
    positions = []
    for expected in EXPECTED[name]:
        assert expected in lines, f"{name}: {expected!r} missing from output:\n{proc.stdout}"
        positions.append(lines.index(expected))
    assert positions == sorted(positions), f"{name}: lines out of order:\n{proc.stdout}"
