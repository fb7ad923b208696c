"""``flowengine events``: the live view in a pseudo-terminal, and --json."""

from __future__ import annotations

import json
import os
import pty
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from flowengine import engines
from flowengine.commands import events_view
from tests.commands import sample_flows
from tests.worker_based import event_tasks
from tests.worker_based.executor_helpers import running_worker, unique
from tests.worker_based.test_cli import _env

#: Bounded wait (s), only so that a bug fails a test instead of hanging it.
WAIT_S = 30.0

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _conn(tmp_path) -> dict:
    return {"transport": "filesystem", "transport_options": {"data_folder": str(tmp_path / "bus")}}


def _events_cmd(exchange: str, tmp_path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "flowengine",
        "events",
        "--exchange",
        exchange,
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={tmp_path / 'bus'}",
        *extra,
    ]


def _run_flow(exchange: str, tmp_path, count: int = 3) -> None:
    engine = engines.load(
        sample_flows.steps(count),
        store={"v0": 0},
        engine="worker-based",
        exchange=exchange,
        topics=["t"],
        events=True,
        **_conn(tmp_path),
    )
    engine.run()
    assert engine.storage.fetch(f"v{count}") == count


def test_state_follows_a_request_and_a_worker():
    state = events_view.EventsState()
    base = {"hostname": "w1", "pid": 1, "timestamp": time.time(), "utcoffset": 0}
    state.apply({**base, "type": "worker-online", "clock": 1, "topic": "t"})
    state.apply({**base, "type": "task-received", "clock": 2, "uuid": "u1", "name": "a"})
    state.apply({**base, "type": "task-started", "clock": 3, "uuid": "u1", "name": "a"})
    assert state.workers["w1"].status(time.time()) == "busy"
    state.apply(
        {
            **base,
            "type": "task-succeeded",
            "clock": 4,
            "uuid": "u1",
            "name": "a",
            "runtime": 0.25,
            "processed": 1,
        }
    )
    request = state.requests["u1"]
    assert (request.state, request.worker, request.runtime) == ("SUCCESS", "w1", 0.25)
    # the worker's processed count moves with the task's end, not its next heartbeat
    assert state.workers["w1"].processed == 1
    assert state.workers["w1"].status(time.time()) == "idle"
    assert state.workers["w1"].status(time.time() + 60) == "lost"
    state.apply({**base, "type": "worker-offline", "clock": 5})
    assert state.workers["w1"].status(time.time()) == "offline"


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_json_prints_one_event_per_line(tmp_path):
    # Given `flowengine events --json` listening
    exchange = unique()
    proc = subprocess.Popen(
        _events_cmd(exchange, tmp_path, "--json"),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # A reader thread: waits on the pipe stay bounded (queue.get timeout).
    stdout: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [stdout.put(x) for x in iter(proc.stdout.readline, "")] + [stdout.put("")],
        daemon=True,
    ).start()
    try:
        assert "Listening for events" in proc.stderr.readline()
        # When a worker with events serves a 3-task flow
        with running_worker(exchange, "t", [event_tasks.Step], events=True, **_conn(tmp_path)):
            _run_flow(exchange, tmp_path)
        # Then stdout holds nothing but JSON events, up to flow-finished
        lines = []
        while not lines or lines[-1]["type"] != "worker-offline":
            line = stdout.get(timeout=WAIT_S)  # queue.Empty fails the test
            assert line, "events --json ended early"
            lines.append(json.loads(line))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(WAIT_S)
    assert proc.returncode == 0
    rest = []
    while (line := stdout.get(timeout=WAIT_S)) != "":
        rest.append(line)
    types = [e["type"] for e in lines]
    assert types.count("task-succeeded") == 3 and "flow-finished" in types
    assert all(json.loads(line) for line in rest)  # still only JSON


def _read_until(fd: int, needles: list[str], timeout: float = WAIT_S) -> str:
    """Read the pty until every needle appeared (ANSI codes stripped); the text read."""
    text = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], deadline - time.monotonic())
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        text += chunk.decode(errors="replace")
        plain = _ANSI.sub("", text)
        if all(n in plain for n in needles):
            return plain
    pytest.fail(f"did not see {needles} in:\n{_ANSI.sub('', text)[-3000:]}")


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_live_view_in_a_pseudo_terminal(tmp_path):
    # Given `flowengine events` running in a 160x50 pseudo-terminal
    exchange = unique()
    env = dict(_env(), COLUMNS="160", LINES="50", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen(
        _events_cmd(exchange, tmp_path),
        env=env,
        stdin=child_fd,
        stdout=child_fd,
        stderr=child_fd,
        close_fds=True,
    )
    os.close(child_fd)
    try:
        _read_until(main_fd, ["Listening for events"])
        # When a worker with events runs a 3-task flow
        with running_worker(
            exchange, "t", [event_tasks.Step], events=True, **_conn(tmp_path)
        ) as worker:
            _run_flow(exchange, tmp_path)
            # Then the view shows the worker and each request's outcome
            screen = _read_until(
                main_fd,
                [
                    "Workers",
                    "Requests",
                    worker.worker_id,
                    "step-0",
                    "step-1",
                    "step-2",
                    "SUCCESS",
                    "processed",
                ],
            )
            assert "flow-finished" not in screen  # a view, not a log
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(WAIT_S)
        finally:
            os.close(main_fd)
    assert proc.returncode == 0
