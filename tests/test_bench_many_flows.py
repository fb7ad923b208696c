"""Smoke test for tools/bench/bench_many_flows.py: it must keep running as the code changes.

A few tiny flows on Redis (the script starts its own server), flowengine only
(no TaskFlow virtualenv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import brokers

# Out of the fast tier (tests/fast_tier.py): runs the benchmark in processes of its own.
pytestmark = pytest.mark.broker

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO_ROOT, "tools", "bench", "bench_many_flows.py")

#: Bounds a hang only; a tiny run takes seconds.
RUN_TIMEOUT_S = 120

FLOWS, TASKS = 8, 3


@pytest.mark.slow
@pytest.mark.skipif(brokers.redis_binary() is None, reason="redis-server not installed")
def test_tiny_run_on_redis_prints_the_tables_and_every_flow_ends():
    proc = subprocess.run(
        [
            sys.executable,
            BENCH,
            "--transport",
            "redis",
            "--lib",
            "flowengine",
            "--flows",
            str(FLOWS),
            "--tasks",
            str(TASKS),
            "--repeat",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    table, _, rest = out.partition("flowengine / TaskFlow")
    rows = [line for line in table.splitlines() if line.startswith("| redis | flowengine |")]
    assert len(rows) == 1, table
    # every figure a median with its range over the two repetitions
    cells = [c.strip() for c in rows[0].strip().strip("|").split("|")][2:]
    assert all(" [" in c and c.endswith("]") for c in cells), cells
    results = json.loads(rest[rest.index("\n[") + 1 :])
    assert len(results) == 2
    for r in results:
        assert r["failed_flows"] == r["hung_flows"] == 0 and r["errors"] == [], r
        assert r["tasks_per_s"] == pytest.approx(FLOWS * TASKS / r["wall_s"]), r
        # the engine process grew (it ran more engines than the warm-up's one)
        assert r["peak_rss_mb"] >= r["base_rss_mb"] and r["peak_threads"] >= r["base_threads"], r
    # no TaskFlow in this run: its ratios are '-'
    ratio_row = [line for line in rest.splitlines() if line.startswith("| redis | flowengine |")]
    assert ratio_row and set(ratio_row[0].strip("| ").split(" | ")[2:]) == {"-"}, rest
