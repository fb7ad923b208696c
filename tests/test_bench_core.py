"""Tests for tools/bench/bench_core.py's scale cases, repetition summary and callgrind counts."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(REPO_ROOT, "tools", "bench")
BENCH = os.path.join(BENCH_DIR, "bench_core.py")

#: Bounds a hang only; each child takes well under a second.
CHILD_TIMEOUT_S = 120


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _child(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, BENCH, "--child", *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_scale_case_reports_every_phase_with_cpu_time():
    # Given the smallest scale case, when its child runs it on flowengine
    result = _child("--lib", "flowengine", "--case", "graph-1000", "--engine", "serial")
    # Then each phase, their total and the CPU time of the four are reported.
    assert result["tasks"] == 1000
    phases = sum(result[k] for k in ("build_s", "compile_s", "prepare_s", "run_s"))
    assert result["total_s"] == pytest.approx(phases)
    assert result["cpu_s"] > 0 and result["cpu_run_per_task_ms"] > 0
    assert result["cpu_per_task_ms"] == pytest.approx(result["cpu_s"] / 1000 * 1000.0)
    # The collector's share is part of the CPU time, its full passes a count.
    assert 0 <= result["gc_s"] <= result["cpu_s"]
    assert isinstance(result["gc_full"], int) and result["gc_full"] >= 0
    assert result["peak_rss_mb"] >= result["base_rss_mb"] > 0


def test_collector_clock_counts_full_collections_and_their_time():
    import gc

    bench = _load("bench_core")
    clock = bench._CollectorClock()
    gc.callbacks.append(clock)
    try:
        # Given garbage that only the cyclic collector frees
        for _ in range(10_000):
            cycle: list[object] = []
            cycle.append(cycle)
        del cycle
        # When a full collection and a youngest-generation one run
        gc.collect()
        gc.collect(0)
    finally:
        gc.callbacks.remove(clock)
    # Then exactly the full one is counted, and their time is accumulated
    assert clock.full == 1
    assert clock.cpu_s > 0


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
@pytest.mark.parametrize("phase", ["load", "compile"])
def test_child_stops_after_the_phase_asked_for(phase):
    # engines.load() is a phase of its own, between build and compile, so its
    # fixed first-call cost is not counted as compile's
    assert _load("bench_core").PHASES[2:4] == ("load", "compile")
    result = _child(
        "--lib",
        "flowengine",
        "--case",
        "graph-1000",
        "--engine",
        "serial",
        "--stop-after",
        phase,
    )
    assert result == {"stopped_after": phase}


def test_repetitions_are_summarised_as_median_min_and_max():
    bench = _load("bench_core")
    runs = [
        {
            "lib": "flowengine",
            "case": "graph-1000",
            "engine": "serial",
            "build_s": b,
            "compile_s": 0.1,
            "prepare_s": 0.1,
            "run_s": 0.1,
            "total_s": 0.3,
            "per_task_ms": 0.1,
            "peak_rss_mb": 50.0,
        }
        for b in (0.3, 0.1, 0.2, 0.5, 0.4)
    ]
    merged = bench.summarise(runs + [{"lib": "flowengine", "error": "timeout"}])
    assert merged["repeats"] == 5
    assert (merged["build_s"], merged["build_s_min"], merged["build_s_max"]) == (0.3, 0.1, 0.5)
    out = io.StringIO()
    bench.print_table([merged], out=out)
    row = out.getvalue().splitlines()[-1]
    assert row.startswith("graph-1000") and "300.0ms (100.0ms-500.0ms)" in row


def test_taskflow_is_skipped_only_where_the_output_says_why():
    bench = _load("bench_core")
    assert set(bench.TASKFLOW_SKIPPED) <= set(bench.SCALE_CASES)
    assert all("TaskFlow skipped" in why for why in bench.TASKFLOW_SKIPPED.values())
    assert bench.CASES["graph-100000"] == ("graph", 100_000)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_callgrind_counts_the_difference_between_phases():
    callgrind = _load("callgrind")
    # A child that does more work in its second phase than in its first.
    child = [
        sys.executable,
        "-c",
        "import sys; n = 1 if sys.argv[-1] == 'a' else 200000; sum(range(n))",
    ]
    rows = callgrind.count(child, ("a", "b"), tasks=1, timeout_s=CHILD_TIMEOUT_S, cwd=REPO_ROOT)
    assert "error" not in rows, rows
    assert rows["phases"] == ["b"] and rows["b_instr_per_task"] > 200000
