"""The ``flowengine`` command: argument parsing, the worker command, the demo."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import pytest

from flowengine import cli
from flowengine.demo import flow as demo_flow
from flowengine.demo import tasks as demo_tasks
from flowengine.engines.action_engine import executor as base
from tests.worker_based.executor_helpers import WAIT_S, running_executor, unique

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds the demo may take in a test (it takes about one; bounds a hang).
DEMO_TIMEOUT_S = 60


def _env() -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )


def test_parse_option():
    assert cli._parse_option("a=1") == ("a", 1)
    assert cli._parse_option("b=x") == ("b", "x")
    assert cli._parse_option("c=") == ("c", "")
    assert cli._parse_option('d={"k": true}') == ("d", {"k": True})
    with pytest.raises(argparse.ArgumentTypeError):
        cli._parse_option("no-equals")


def test_worker_requires_exchange_topic_and_tasks(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["worker", "--topic", "t", "--tasks", "m"])
    assert info.value.code == 2
    assert "--exchange" in capsys.readouterr().err


def test_demo_rejects_no_workers(capsys):
    assert cli.main(["demo", "--workers", "0"]) == 2


def test_demo_flow_shape():
    flow = demo_flow.make_flow()
    assert len(flow) == demo_flow.task_count() >= 20
    assert demo_flow.task_count(3) == 3 * 3 + 2 + 1


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_worker_command_serves_until_sigterm(tmp_path):
    # Given `flowengine worker` running over the filesystem transport
    exchange = unique()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowengine",
            "worker",
            "--exchange",
            exchange,
            "--topic",
            "t",
            "--tasks",
            "flowengine.demo.tasks:Combine",
            "--threads",
            "2",
            "--transport",
            "filesystem",
            "--transport-option",
            f"data_folder={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    try:
        with running_executor(
            exchange,
            ["t"],
            transport="filesystem",
            transport_options={"data_folder": str(tmp_path)},
        ) as executor:
            # When a request is sent to it
            assert executor.wait_for_workers(1, WAIT_S) == 0
            fut = executor.execute_task(demo_tasks.Combine("c"), "u-1", {"left": 2, "right": 3})
            assert fut.result(WAIT_S) == (base.EXECUTED, 5)
    finally:
        # Then SIGTERM stops it cleanly
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out
    assert "WBE worker" in out and f"Exchange = {exchange}" in out
    assert "flowengine.demo.tasks.Combine" in out
    assert "u-1" in out and "finished in" in out  # the per-request INFO line


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_demo_succeeds():
    proc = subprocess.run(
        [sys.executable, "-m", "flowengine", "demo", "--workers", "2"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=DEMO_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = demo_flow.expected_total()
    assert f"Result: 8 sources, sum of squares = {expected}" in proc.stdout
    assert "32/32 tasks done" in proc.stdout
