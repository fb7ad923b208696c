"""``flowengine graph``, ``engine.draw()`` and ``flowengine run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from flowengine import cli, engines
from flowengine.engines.action_engine import graph_draw
from tests.commands import sample_flows
from tests.worker_based import event_tasks
from tests.worker_based.executor_helpers import running_worker, unique
from tests.worker_based.test_cli import _env

#: Bounded wait (s), only so that a bug fails a test instead of hanging it.
WAIT_S = 60.0

SVG_NS = "{http://www.w3.org/2000/svg}"


def _need_dot() -> None:
    """Skip without Graphviz locally; in CI (.ci/run installs it) that is a failure."""
    if graph_draw.dot_program() is None:
        if os.environ.get("CI"):
            pytest.fail("Graphviz's dot is missing in CI (.ci/run installs graphviz)")
        pytest.skip("Graphviz's dot is not installed")


def _flowengine(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowengine", *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        timeout=WAIT_S,
    )


def test_dot_shows_clusters_atoms_edges_and_the_retry():
    dot = graph_draw.to_dot(sample_flows.nested())
    assert dot.startswith("digraph flow {") and dot.rstrip().endswith("}")
    assert dot.count("subgraph cluster_") == 3  # outer, guarded, fan
    assert 'label="guarded (graph_flow) - retry: again"' in dot
    assert "shape=diamond" in dot and 'label="again\\nTimes"' in dot
    for name in ("first", "inner", "left", "right", "last"):
        assert f'label="{name}\\nNoop"' in dot
    assert dot.count("->") >= 8


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_graph_command_writes_dot_without_graphviz(tmp_path):
    # Given no Graphviz on PATH
    env = dict(_env(), PATH=str(tmp_path))
    # When DOT output is asked for, it is written
    out = tmp_path / "flow.dot"
    proc = _flowengine("graph", "tests.commands.sample_flows:nested", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("digraph flow {")
    # And on stdout by default
    proc = _flowengine("graph", "tests.commands.sample_flows:nested", env=env)
    assert proc.returncode == 0 and "subgraph cluster_" in proc.stdout
    # But SVG says what is missing
    proc = _flowengine(
        "graph", "tests.commands.sample_flows:nested", "-o", str(tmp_path / "flow.svg"), env=env
    )
    assert proc.returncode == 3 and "apt-get install graphviz" in proc.stderr


def test_graph_command_rejects_a_bad_factory(capsys):
    assert cli.main(["graph", "no-colon"]) == 2
    assert "module:flow_factory" in capsys.readouterr().err


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_graph_command_writes_a_valid_svg_for_nested_flows(tmp_path):
    _need_dot()
    out = tmp_path / "flow.svg"
    proc = _flowengine("graph", "tests.commands.sample_flows:nested", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(out).getroot()
    assert root.tag == f"{SVG_NS}svg"
    clusters = [g for g in root.iter(f"{SVG_NS}g") if g.get("class") == "cluster"]
    assert len(clusters) == 3
    texts = {t.text for t in root.iter(f"{SVG_NS}text")}
    assert {"first", "inner", "left", "right", "last", "again"} <= texts


def test_engine_draw_colours_atoms_by_state(tmp_path):
    engine = engines.load(sample_flows.steps(2), store={"v0": 0})
    engine.run()
    dot = engine.draw()
    assert dot.count(f'fillcolor="{graph_draw.STATE_COLOURS["SUCCESS"]}"') == 2
    assert "[SUCCESS]" in dot
    if graph_draw.dot_program() is not None:
        engine.draw(str(tmp_path / "run.svg"))
        assert ET.parse(tmp_path / "run.svg").getroot().tag == f"{SVG_NS}svg"


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_run_command_prints_results():
    proc = _flowengine("run", "tests.commands.sample_flows:steps", "--store", "v0=40")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert results["v3"] == 43
    assert "steps" in proc.stderr  # the progress bar's description


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_run_command_fails_with_the_flow():
    proc = _flowengine("run", "tests.commands.sample_flows:steps", "--no-progress")
    assert proc.returncode == 1  # v0 is missing
    assert "flow failed" in proc.stderr


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_run_command_on_a_worker_prints_results_and_remote_timings(tmp_path):
    # Given a worker serving Step over the filesystem transport
    exchange = unique()
    folder = str(tmp_path / "bus")
    with running_worker(
        exchange,
        "t",
        [event_tasks.Step],
        transport="filesystem",
        transport_options={"data_folder": folder},
    ):
        # When `flowengine run --engine worker-based` runs a 3-step flow there
        proc = _flowengine(
            "run",
            "tests.commands.sample_flows:steps",
            "--store",
            "v0=1",
            "--engine",
            "worker-based",
            "--exchange",
            exchange,
            "--topic",
            "t",
            "--transport",
            "filesystem",
            "--transport-option",
            f"data_folder={folder}",
        )
    # Then the results and each remote atom's timings are printed
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["v3"] == 4
    for i in range(3):
        assert f"step-{i}: queue " in proc.stderr and "attempts 1" in proc.stderr
