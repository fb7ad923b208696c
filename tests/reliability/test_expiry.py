"""A request that timed out on the engine side is never run later by a slow worker.

Given a worker process with one thread, busy with a blocking task, when a
second request waits behind it past the executor's transition timeout,
then the engine fails it with RequestTimeout, and once the worker is free
again it drops that request unrun (the checker finds no execution of it)
while later requests still run.
"""

from __future__ import annotations

import os
import uuid

import pytest

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.types import failure as ft
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import Workers

#: The executor's transition timeout (s): short, it is what the test waits out.
TRANSITION_TIMEOUT_S = 1.5

#: Bounded wait (s) for results, only to fail instead of hanging.
WAIT_S = 60.0


@pytest.mark.slow
def test_timed_out_request_never_runs_later(conn, tmp_path, unique_name):
    records = str(tmp_path / "records.jsonl")
    fifo = str(tmp_path / "release.fifo")
    os.mkfifo(fifo)
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(conn, unique_name, "slow", records, str(logs), threads=1)
    executor = wex.WorkerTaskExecutor(
        uuid.uuid4().hex,
        unique_name,
        ["slow"],
        transition_timeout=TRANSITION_TIMEOUT_S,
        **conn.kwargs(),
    )
    try:
        workers.start()
        executor.start()
        assert executor.wait_for_workers(1, WAIT_S) == 0, workers.logs()
        # Given the worker's only thread blocked in a task
        blocked = executor.execute_task(fault_tasks.Blocker("a"), "ua", {"fifo": fifo})
        # When another request waits behind it past the transition timeout
        late = executor.execute_task(fault_tasks.Step("b"), "ub", {"n": 1, "pause": 0})
        _, result = late.result(WAIT_S)
        # Then the engine gives up on it
        assert isinstance(result, ft.Failure) and result.check(exc.RequestTimeout), result
        with open(fifo, "w") as f:  # the worker becomes free
            f.write("go\n")
        assert blocked.result(WAIT_S) == (base.EXECUTED, "go")
        # ...and a request sent after it runs (the worker takes them in order,
        # so by now the timed-out one was dropped, not run)
        after = executor.execute_task(fault_tasks.Step("c"), "uc", {"n": 3, "pause": 0})
        assert after.result(WAIT_S) == (base.EXECUTED, 3)
    finally:
        executor.stop()
        workers.stop_all()
    report = checker.check(checker.read_records(records), ["a", "b", "c"])
    assert report.done_once == ["a", "c"] and report.lost == ["b"], report.summary()
    assert "b" not in report.executions  # never even started
    assert "Dropped request ub" in workers.logs()
