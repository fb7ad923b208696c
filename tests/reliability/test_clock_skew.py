"""A worker whose clock is two minutes off neither drops live requests nor runs expired ones.

``expires`` is a time on the engine's clock; the worker reads that clock off
the send times of the engine's messages instead of trusting its own (see
flowengine/engines/worker_based/wire/peer_clock.py).

Given one worker process whose clock runs 120 s ahead of (or behind) the
engine's, with one thread:
- when the engine sends requests it still waits for, then they all run (a
  worker trusting its own clock 120 s ahead would drop every one: 0 wrongful
  drops);
- when a request waits on that worker behind a blocked task past the
  engine's transition timeout, then the engine fails it and, once free, the
  worker drops it unrun (one trusting its clock 120 s behind would run it:
  0 expired runs), and a request sent after it still runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.types import failure as ft
from tests import proc_utils
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import HEARTBEAT_S, ROOT, STOP_TIMEOUT_S, env

pytestmark = pytest.mark.slow

#: How far the worker's clock is off (s), both ways.
SKEW_S = 120.0

#: The engine's transition timeout (s): short, the test waits it out once.
TRANSITION_TIMEOUT_S = 2.0

#: Requests that must all run.
LIVE_REQUESTS = 5

#: Bounded wait (s) for results, only to fail instead of hanging.
WAIT_S = 60.0


@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
def test_skewed_worker_clock(conn, skew, tmp_path, unique_name):
    records = str(tmp_path / "records.jsonl")
    fifo = str(tmp_path / "release.fifo")
    os.mkfifo(fifo)
    log_path = str(tmp_path / "worker.log")
    cmd = [
        sys.executable,
        "-m",
        "tests.reliability.skewed_worker",
        str(skew),
        "worker",
        "--exchange",
        unique_name,
        "--topic",
        "skew",
        "--threads",
        "1",
        "--heartbeat-interval",
        str(HEARTBEAT_S),
        "--tasks",
        "tests.reliability.fault_tasks",
        *conn.cli_args(),
    ]
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env(records), cwd=ROOT
        )
    executor = wex.WorkerTaskExecutor(
        uuid.uuid4().hex,
        unique_name,
        ["skew"],
        transition_timeout=TRANSITION_TIMEOUT_S,
        **conn.kwargs(),
    )

    def worker_log() -> str:
        with open(log_path, errors="replace") as f:
            return f.read()

    live = [f"live{i}" for i in range(LIVE_REQUESTS)]
    try:
        executor.start()
        assert executor.wait_for_workers(1, WAIT_S) == 0, worker_log()
        # When the engine sends requests it waits for, they all run
        for i, name in enumerate(live):
            outcome = executor.execute_task(
                fault_tasks.Step(name), f"u-{name}", {"n": i, "pause": 0}
            ).result(WAIT_S)
            assert outcome == (base.EXECUTED, i), (outcome, worker_log())
        # Given the worker's only thread blocked in a task
        blocked = executor.execute_task(fault_tasks.Blocker("block"), "u-block", {"fifo": fifo})
        # When another request waits behind it past the transition timeout
        late = executor.execute_task(fault_tasks.Step("late"), "u-late", {"n": 1, "pause": 0})
        _, result = late.result(WAIT_S)
        assert isinstance(result, ft.Failure) and result.check(exc.RequestTimeout), result
        with open(fifo, "w") as f:  # the worker becomes free
            f.write("go\n")
        assert blocked.result(WAIT_S) == (base.EXECUTED, "go")
        # Then it drops that request unrun, and still runs the next one
        after = executor.execute_task(fault_tasks.Step("after"), "u-after", {"n": 3, "pause": 0})
        assert after.result(WAIT_S) == (base.EXECUTED, 3), worker_log()
    finally:
        executor.stop()
        proc_utils.stop_processes([worker], STOP_TIMEOUT_S)
    report = checker.check(checker.read_records(records), [*live, "block", "late", "after"])
    # 0 wrongful drops, 0 expired runs
    assert report.done_once == [*live, "block", "after"], report.summary()
    assert report.lost == ["late"] and "late" not in report.executions, report.summary()
    log = worker_log()
    assert "Dropped request u-late" in log, log
    assert log.count("Dropped request") == 1, log
    print(
        f"[clock skew/{conn.kind} {skew:+.0f} s] {report.summary()}; dropped unrun: {report.lost}"
    )
