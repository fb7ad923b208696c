"""Smoke test for tools/bench/bench_sides.py: it must keep running as the code changes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

# Out of the fast tier (tests/fast_tier.py): runs the benchmark in processes of its own.
pytestmark = pytest.mark.broker

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO_ROOT, "tools", "bench", "bench_sides.py")

#: Bounds a hang only; the run takes a few seconds.
RUN_TIMEOUT_S = 300


def test_a_tiny_run_against_this_tree_prints_both_sides_and_their_ratio():
    # Given this tree measured against itself (as --baseline), tiny rounds
    proc = subprocess.run(
        [
            sys.executable,
            BENCH,
            "--baseline",
            REPO_ROOT,
            "--repeat",
            "1",
            "--rounds",
            "2",
            "--requests",
            "40",
            "--tasks",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Then each side has a row with a positive figure per tree and a ratio
    rows = dict(re.findall(r"^\| (worker|engine) \| (.*) \|$", proc.stdout, re.MULTILINE))
    assert set(rows) == {"worker", "engine"}, proc.stdout
    for side, row in rows.items():
        figures = re.findall(r"(\d+\.\d+) \[\d+\.\d+-\d+\.\d+\]", row)
        assert len(figures) == 2 and all(float(f) > 0 for f in figures), (side, row)
        assert re.search(r"\| \d+\.\d+x$", row), (side, row)


def test_a_cpu_this_process_may_not_use_is_refused():
    proc = subprocess.run(
        [sys.executable, BENCH, "--cpu", "4096"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2
    assert "--cpu 4096" in proc.stderr
