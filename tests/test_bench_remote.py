"""Smoke test for tools/bench/bench_remote.py: it must keep running as the code changes.

Tiny flows on memory and filesystem only, flowengine and the raw-kombu floor
only (no brokers to start, no TaskFlow virtualenv).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO_ROOT, "tools", "bench", "bench_remote.py")

#: Bounds a hang only; the tiny run takes a few seconds.
RUN_TIMEOUT_S = 120


@pytest.mark.slow
def test_tiny_run_on_memory_and_filesystem_prints_the_tables():
    proc = subprocess.run(
        [sys.executable, BENCH, "--tiny", "--transport", "memory", "--transport", "filesystem",
         "--lib", "floor", "--lib", "flowengine"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Per-task latency" in out and "Throughput" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("memory", "filesystem")}
    # Two tables, one row per transport in each; latency rows carry the floor,
    # flowengine's figure and their ratio (no TaskFlow: '-').
    assert set(rows) == {"memory", "filesystem"}
    latency = [line.split() for line in out.split("Throughput")[0].splitlines()
               if line.startswith(("memory", "filesystem"))]
    for row in latency:
        floor, fe, ratio = row[1], row[2], row[5]
        assert floor.endswith("ms") and fe.endswith("ms") and ratio.endswith("x"), row
        assert row[3] == row[4] == "-", row  # no TaskFlow in this run
    assert "ERROR" not in out and "timeout" not in out
