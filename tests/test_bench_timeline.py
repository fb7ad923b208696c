"""Smoke test for tools/bench/bench_timeline.py: it must keep running as the code changes.

Short chains on memory (workers in the engine's process) and filesystem
(worker processes: their stamps come back through files).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

# Out of the fast tier (tests/fast_tier.py): runs the benchmark in processes of its own.
pytestmark = pytest.mark.broker

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO_ROOT, "tools", "bench", "bench_timeline.py")

#: Bounds a hang only; a run takes a few seconds.
RUN_TIMEOUT_S = 120

#: Steps every task's cycle has, engine's and worker's, in the order they happen.
STEPS_IN_ORDER = [
    "e.submit>",
    "e.put>",
    "w.rx>",
    "w.req>",
    "w.accept>",
    "w.perform>",
    "e.resp:SUCCESS>",
    "e.woke",
    "next e.submit>",
]


@pytest.mark.parametrize("transport", ["memory", "filesystem"])
def test_a_short_chain_prints_each_step_of_the_cycle(transport):
    proc = subprocess.run(
        [sys.executable, BENCH, "--transport", transport, "--tasks", "40"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(
        r"^\s+(\d+)\s+\(\+\s*-?\d+\)\s+(\S.*?)\s+\[(\d+)\]$", proc.stdout, re.MULTILINE
    )
    steps = [step for _offset, step, _count in rows]
    assert [s for s in steps if s in STEPS_IN_ORDER] == STEPS_IN_ORDER, proc.stdout
    offsets = [int(offset) for offset, _step, _count in rows]
    assert offsets == sorted(offsets) and offsets[-1] > 0, proc.stdout
    # 40 tasks: 39 cycles (submit to next submit), the first 10 % left out.
    assert {int(count) for _o, step, count in rows if step in STEPS_IN_ORDER} == {36}, proc.stdout
    cpu = proc.stdout.split("CPU of each step")[1]
    for step in ("e.submit", "e.put", "w.req", "w.perform"):
        assert re.search(rf"^\s+{re.escape(step)}\s+\d+\.\d\s+\(n=\d+\)$", cpu, re.MULTILINE), (
            proc.stdout
        )
