"""Smoke test for tools/bench/bench_tracing.py: it must keep running as the code changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Out of the fast tier (tests/fast_tier.py): runs the tracing benchmark in processes of its own.
pytestmark = pytest.mark.broker

pytest.importorskip(
    "opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed (pip install -e .[test])"
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO_ROOT, "tools", "bench", "bench_tracing.py")


def test_a_short_run_times_every_mode_and_records_every_span():
    proc = subprocess.run(
        [sys.executable, BENCH, "--tasks", "10", "--runs", "1", "--sdk", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(proc.stdout.splitlines()[-1])
    assert set(row) == {"off", "noop", "sdk"}
    assert all(row[mode]["wall_ms"] > 0 and row[mode]["cpu_ms"] > 0 for mode in row)
    # 10 tasks: a flow span, 10 atom spans and 10 worker spans per run
    assert "sdk: 21 spans per flow" in proc.stderr
