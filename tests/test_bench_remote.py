"""Smoke tests for tools/bench/bench_remote.py and bench_startup.py: they must keep running
as the code changes.

Tiny flows on memory and filesystem only, flowengine and the raw-kombu floor
only (no brokers to start, no TaskFlow virtualenv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Out of the fast tier (tests/fast_tier.py): runs the benchmark in processes of its own.
pytestmark = pytest.mark.broker

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO_ROOT, "tools", "bench", "bench_remote.py")
STARTUP = os.path.join(REPO_ROOT, "tools", "bench", "bench_startup.py")

#: Bounds a hang only; a tiny run takes seconds (its cases are processes of their own).
RUN_TIMEOUT_S = 120


@pytest.mark.slow
def test_tiny_run_on_memory_and_filesystem_prints_the_tables():
    proc = subprocess.run(
        [
            sys.executable,
            BENCH,
            "--tiny",
            "--transport",
            "memory",
            "--transport",
            "filesystem",
            "--lib",
            "floor",
            "--lib",
            "flowengine",
            "--repeat",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Per-task latency" in out and "Throughput" in out
    latency_table, rest = out.split("CPU per task, steady")
    cpu_table, rest = rest.split("Context switches per task")
    switches_table, rest = rest.split("One-task run")
    one_task_table, throughput_table = rest.split("Throughput")
    # Each table has one row per transport: | memory | ... |
    tables = (latency_table, cpu_table, switches_table, one_task_table, throughput_table)
    for table in tables:
        assert set(_rows(table)) == {"memory", "filesystem"}, table
    for cells in _rows(switches_table).values():
        # floor, flowengine: context switches per task, steady
        assert len(cells) == 2 and all(_is_median_with_range(c) for c in cells), cells
    for cells in _rows(cpu_table).values():
        # floor, flowengine (CPU ms per task, steady), flowengine's ratio to the floor
        floor_cpu, fe_cpu, ratio = cells
        assert _is_median_with_range(floor_cpu) and _is_median_with_range(fe_cpu), cells
        assert ratio.endswith("x") and float(ratio[:-1]) > 0, cells
    for cells in _rows(latency_table).values():
        # floor, flowengine: "median [min-max]"; no Celery, Dramatiq or TaskFlow
        # in this run ('-'); then flowengine's ratio to the floor
        floor, fe, celery, dramatiq, tf_tuned, tf_default, ratio = cells[:7]
        assert _is_median_with_range(floor) and _is_median_with_range(fe), cells
        assert celery == dramatiq == tf_tuned == tf_default == "-", cells
        assert ratio.endswith("x") and float(ratio[:-1]) > 0, cells
        # then the floor of three messages (request, PENDING, outcome) and
        # flowengine's ratio to it; last, the serial engine's cost per task,
        # the least a remote task could take (floor of three messages plus
        # that cost) and flowengine's ratio to it
        floor_3, ratio_3, serial, least, ratio_least = cells[-5:]
        assert _is_median_with_range(floor_3) and _is_median_with_range(serial), cells
        assert ratio_3.endswith("x") and float(ratio_3[:-1]) > 0, cells
        assert float(least.removesuffix("ms")) > float(floor_3.split()[0]), cells
        assert ratio_least.endswith("x") and float(ratio_least[:-1]) > 0, cells
    for cells in _rows(throughput_table).values():
        assert _is_median_with_range(cells[0]), cells
    assert "ERROR" not in out and "timeout" not in out


@pytest.mark.slow
def test_cpu_option_runs_every_case_on_that_cpu_only():
    cpu = min(os.sched_getaffinity(0))
    proc = subprocess.run(
        [
            sys.executable,
            BENCH,
            "--tiny",
            "--transport",
            "memory",
            "--lib",
            "floor",
            "--lib",
            "flowengine",
            "--repeat",
            "1",
            "--cpu",
            str(cpu),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Every case ran on CPU {cpu} only" in proc.stdout
    results = json.loads(proc.stdout[proc.stdout.index("\n[") + 1 :])
    assert {r["case"] for r in results} == {
        "floor",
        "floor-3",
        "latency",
        "throughput",
        "one-task",
        "serial",
    }
    assert all(r["cpus"] == [cpu] for r in results), results


def test_cpu_option_refuses_a_cpu_this_process_cannot_use():
    unusable = max(os.sched_getaffinity(0)) + 1
    proc = subprocess.run(
        [sys.executable, BENCH, "--tiny", "--cpu", str(unusable)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2
    assert f"--cpu {unusable}: not one of the CPUs this process may use" in proc.stderr


def test_startup_diagnostic_splits_a_one_task_run_into_its_phases():
    proc = subprocess.run(
        [sys.executable, STARTUP, "--transport", "memory", "--runs", "3"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(proc.stdout)
    assert list(rows) == ["memory"], proc.stdout
    cells = rows["memory"]
    assert len(cells) == 5 and all(_is_median_with_range(c) for c in cells), cells
    run, start, consumer, task, stop = (float(c.split()[0]) for c in cells)
    # Each run's wait for its consumer is part of its start, so the medians keep that order
    assert 0 <= consumer <= start < run and task > 0 and stop > 0, cells


def _rows(table: str) -> dict[str, list[str]]:
    """A markdown table's rows by their first cell (transport), header rows left out."""
    rows = {}
    for line in table.splitlines():
        if line.startswith("|") and not line.startswith(("| transport", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def _is_median_with_range(cell: str) -> bool:
    """'1.48 [1.31-1.56]': a median and its min-max over the repetitions."""
    median, _, spread = cell.partition(" ")
    low, _, high = spread.strip("[]").partition("-")
    return all(_is_number(x) for x in (median, low, high)) and float(low) <= float(high)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
