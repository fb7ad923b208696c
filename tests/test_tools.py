"""Smoke tests for tools/bench: the benchmark must keep running as the code changes."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO_ROOT, "tools", "bench", "bench_core.py")


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_core", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_bench_child_runs_a_case_on_flowengine():
    proc = subprocess.run(
        [
            sys.executable,
            BENCH,
            "--child",
            "--lib",
            "flowengine",
            "--case",
            "linear-50",
            "--engine",
            "serial",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["lib"] == "flowengine" and result["tasks"] == 50
    assert result["engine_class"] == "SerialActionEngine"
    for key in ("compile_s", "prepare_s", "run_s", "per_task_ms", "peak_rss_mb"):
        assert result[key] > 0, key


def test_bench_graph_is_the_same_for_every_run():
    bench = _load_bench()
    deps = bench._graph_deps(2000)
    assert deps == bench._graph_deps(2000)
    assert all(all(j < i for j in d) for i, d in enumerate(deps))
    assert sum(map(len, deps)) > 2000  # a real graph, not a chain of singles


def test_bench_table_prints_ratios():
    bench = _load_bench()
    row = {
        "case": "linear-50",
        "engine": "serial",
        "tasks": 50,
        "build_s": 0.01,
        "prepare_s": 0.01,
        "per_task_ms": 0.1,
        "peak_rss_mb": 40.0,
    }
    results = [
        {**row, "lib": "flowengine", "compile_s": 0.01, "run_s": 0.005},
        {**row, "lib": "taskflow", "compile_s": 0.02, "run_s": 0.1, "peak_rss_mb": 80.0},
    ]
    out = io.StringIO()
    bench.print_table(results, out=out)
    text = out.getvalue()
    assert "flowengine / TaskFlow" in text
    ratio_line = text.strip().splitlines()[-1].split()
    assert ratio_line[:2] == ["linear-50", "serial"]
    assert ratio_line[2:] == ["0.50x", "0.050x", "0.25x", "0.50x"]


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_readme_commands_prints_the_quick_start_exactly_as_the_readme_shows_it():
    tool = os.path.join(REPO_ROOT, "tools", "readme_commands.py")
    proc = subprocess.run(
        [sys.executable, tool, "quick-start"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert f"<!-- ci: quick-start -->\n```sh\n{proc.stdout}```" in readme


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_readme_commands_fails_on_an_unknown_block():
    tool = os.path.join(REPO_ROOT, "tools", "readme_commands.py")
    proc = subprocess.run(
        [sys.executable, tool, "no-such-block"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 1
    assert "no '<!-- ci: no-such-block -->' marker" in proc.stderr


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_check_imports_imports_every_module_here():
    # This environment has every extra: nothing may fail or need one.
    tool = os.path.join(REPO_ROOT, "tools", "check_imports.py")
    proc = subprocess.run(
        [sys.executable, tool, "--require-all"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 need an extra, 0 failed" in proc.stdout


def test_ci_tests_the_lowest_kombu_setup_cfg_accepts():
    root = pathlib.Path(__file__).resolve().parent.parent
    wanted = re.search(r"^\s*kombu>=([0-9.]+),", (root / "setup.cfg").read_text(), re.M)
    tested = re.search(r"^KOMBU_LOWEST=([0-9.]+)$", (root / ".ci" / "run").read_text(), re.M)
    assert wanted and tested and wanted.group(1) == tested.group(1)
