"""Fault tests: per-task soft and hard time limits, process and thread executors.

Real ``flowengine worker`` processes (filesystem transport, and Redis where
marked); tasks write what they do to a ledger the checkers count.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import pytest

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.wire import timelimits as tl
from flowengine.types import failure as ft
from tests.reliability import lifecycle_tasks as lt
from tests.reliability import worker_procs as wp

TOPIC = "limits"

#: Hard limit (s) of the blocking task: long enough for a loaded machine to
#: fork and start it, short enough to keep the test quick.
HARD_S = 1.0
#: Soft limit (s) of the task that catches SoftTimeLimitExceeded.
SOFT_S = 0.3


def _executor(exchange: str, conn: dict) -> wex.WorkerTaskExecutor:
    executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, [TOPIC], **conn)
    executor.start()
    return executor


def _limited(task: object, soft: float | None = None, hard: float | None = None) -> object:
    # Per-instance limits: the executor sends them in the timelimit header.
    task.soft_time_limit = soft
    task.time_limit = hard
    return task


def _check_ledger(folder: str, expect_done: dict[str, int], expect_started: set[str]) -> None:
    """Checker: each request's body ran (started) once; finished bodies counted exactly."""
    events = lt.read_ledger(folder)
    starts: dict[str, int] = {}
    ends: dict[str, int] = {}
    for e in events:
        book = starts if e["event"] == "start" else ends if e["event"] == "end" else None
        if book is not None:
            book[e["task"]] = book.get(e["task"], 0) + 1
    duplicated = sorted(name for name, n in starts.items() if n > 1)
    lost = sorted(name for name in expect_started if starts.get(name, 0) == 0)
    assert (duplicated, lost) == ([], []), f"duplicated {duplicated}, lost {lost}: {events}"
    assert {n: ends.get(n, 0) for n in expect_done} == expect_done, events


# --- the resolution rules (no broker) ------------------------------------------


class _Declares:
    soft_time_limit = 5
    time_limit = 10


def test_limits_come_from_header_then_class_then_worker_default():
    default = tl.make(1, 2)
    assert tl.resolve(None, object, default) == (1.0, 2.0)
    assert tl.resolve(None, _Declares, default) == (5.0, 10.0)
    assert tl.resolve([None, 3], _Declares, default) == (5.0, 3.0)
    assert tl.resolve([0.5, None], object) == (0.5, None)


def test_bad_timelimit_header_is_refused():
    for bad in ("10", [1], [1, 2, 3], [-1, 2], [True, 2], {"soft": 1}):
        with pytest.raises(exc.InvalidFormat):
            tl.parse_header(bad)


def test_executor_sends_the_task_instance_limits():
    task = _limited(lt.Echo("e"), soft=2, hard=4)
    assert tl.header_for(task) == [2.0, 4.0]
    assert tl.header_for(lt.Echo("plain")) is None


# --- process executor, real worker processes ------------------------------------


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
@pytest.mark.parametrize("kind", ["filesystem", pytest.param("redis", marks=pytest.mark.broker)])
def test_hard_limit_kills_the_task_process_and_the_worker_keeps_serving(kind, tmp_path, request):
    # Given a worker process running task bodies in forked children
    folder = str(tmp_path)
    conn = wp.conn_for(kind, tmp_path, request)
    exchange = wp.unique()
    with wp.workers(1, exchange, TOPIC, folder, conn, extra=("--executor", "process")) as (w,):
        executor = _executor(exchange, conn)
        try:
            assert executor.wait_for_workers(1, wp.WAIT_S) == 0, w.log()
            # When a task blocks past its hard limit
            blocker = _limited(lt.Blocker("blocker"), hard=HARD_S)
            fut = executor.execute_task(blocker, "req-block", {"folder": folder})
            event, failure = fut.result(wp.WAIT_S)
            # Then it fails with TimeLimitExceeded, and its process is gone
            assert event == base.EXECUTED and isinstance(failure, ft.Failure)
            assert failure.check(exc.TimeLimitExceeded), failure
            (started,) = [e for e in lt.read_ledger(folder) if e["task"] == "blocker"]
            assert started["pid"] != w.pid
            with pytest.raises(ProcessLookupError):
                os.kill(started["pid"], 0)  # killed and reaped by the worker
            # And the same worker serves the next request
            fut = executor.execute_task(lt.Echo("echo"), "req-echo", {"folder": folder, "value": 7})
            assert fut.result(wp.WAIT_S) == (base.EXECUTED, 7)
        finally:
            executor.stop()
        assert w.proc.poll() is None, "the worker died"
    assert "exceeded its hard time limit" in w.log()
    _check_ledger(folder, {"blocker": 0, "echo": 1}, {"blocker", "echo"})


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_soft_limit_raises_inside_the_task_process(tmp_path, request):
    # Given a process-executor worker and a task with a soft and a hard limit
    folder = str(tmp_path)
    conn = wp.conn_for("filesystem", tmp_path, request)
    exchange = wp.unique()
    with wp.workers(1, exchange, TOPIC, folder, conn, extra=("--executor", "process")):
        executor = _executor(exchange, conn)
        try:
            assert executor.wait_for_workers(1, wp.WAIT_S) == 0
            # When the soft limit passes while the body sleeps
            task = _limited(lt.SoftCatcher("soft"), soft=SOFT_S, hard=30)
            fut = executor.execute_task(task, "req-soft", {"folder": folder})
            # Then SoftTimeLimitExceeded was raised in it and it cleaned up
            assert fut.result(wp.WAIT_S) == (base.EXECUTED, "cleaned up after the soft limit")
        finally:
            executor.stop()
    assert [e["event"] for e in lt.read_ledger(folder)] == ["start", "soft-limit"]


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_child_progress_reaches_the_executor_and_a_dying_child_is_reported(tmp_path, request):
    # Given a process-executor worker
    folder = str(tmp_path)
    conn = wp.conn_for("filesystem", tmp_path, request)
    exchange = wp.unique()
    with wp.workers(1, exchange, TOPIC, folder, conn, extra=("--executor", "process")) as (w,):
        executor = _executor(exchange, conn)
        try:
            assert executor.wait_for_workers(1, wp.WAIT_S) == 0
            # When a task reports progress from its child process
            seen = []
            fut = executor.execute_task(
                lt.Progressing("prog"),
                "req-prog",
                {"folder": folder},
                progress_callback=lambda kind, d: seen.append((kind, d)),
            )
            event, child_pid = fut.result(wp.WAIT_S)
            # Then the events arrive (JSON through the pipe, then the broker)
            assert child_pid != w.pid
            progress = [d["progress"] for kind, d in seen if kind == "update_progress"]
            assert progress == [0.25, 0.75]
            # When a task's process dies without a word
            fut = executor.execute_task(lt.Suicide("suicide"), "req-die", {"folder": folder})
            _, failure = fut.result(wp.WAIT_S)
            # Then that is reported, and the worker goes on
            assert isinstance(failure, ft.Failure) and failure.check(exc.TaskProcessDied)
            assert "exited with status 3" in failure.exception_str
            fut = executor.execute_task(lt.Echo("echo"), "req-echo", {"folder": folder, "value": 1})
            assert fut.result(wp.WAIT_S) == (base.EXECUTED, 1)
        finally:
            executor.stop()
    _check_ledger(folder, {"prog": 1, "suicide": 0, "echo": 1}, {"prog", "suicide", "echo"})


# --- thread executor (in-process worker: interruption, not killing) --------------


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_thread_executor_interrupts_at_soft_and_hard_limits():
    from tests.worker_based.executor_helpers import running_executor, running_worker, unique

    folder_dir = tempfile.mkdtemp(prefix="fe-limits-")
    exchange = unique()
    with (
        running_worker(exchange, TOPIC, [lt.SoftCatcher, lt.Blocker, lt.Echo]) as worker,
        running_executor(exchange, [TOPIC]) as executor,
    ):
        assert worker.task_runner.kind == "threads"
        assert executor.wait_for_workers(1, wp.WAIT_S) == 0
        # Given tasks sleeping in a Python loop (an interruption fires between calls)
        soft = executor.execute_task(
            _limited(lt.SoftCatcher("soft"), soft=SOFT_S), "t-soft", {"folder": folder_dir}
        )
        hard = executor.execute_task(
            _limited(lt.Blocker("hard"), hard=HARD_S), "t-hard", {"folder": folder_dir}
        )
        # Then the soft limit raised inside the body, the hard one failed the request
        assert soft.result(wp.WAIT_S) == (base.EXECUTED, "cleaned up after the soft limit")
        _, failure = hard.result(wp.WAIT_S)
        assert isinstance(failure, ft.Failure) and failure.check(exc.TimeLimitExceeded)
        # And the pool thread is free again for the next request
        echo = executor.execute_task(lt.Echo("echo"), "t-echo", {"folder": folder_dir, "value": 3})
        assert echo.result(wp.WAIT_S) == (base.EXECUTED, 3)
    _check_ledger(folder_dir, {"soft": 0, "hard": 0, "echo": 1}, {"soft", "hard", "echo"})


def test_invalid_timelimit_header_fails_the_request():
    from tests.worker_based.executor_helpers import running_worker, unique
    from tests.worker_based.wire_helpers import Client

    exchange = unique()
    with running_worker(exchange, TOPIC, [lt.Echo]), Client(exchange, transport="memory") as c:
        # When a request carries a timelimit header nobody can read
        cid = c.request(
            lt.Echo("e"),
            arguments={"folder": "/nonexistent"},
            routing_key=TOPIC,
            headers={pr.HEADER_TIMELIMIT: "ten seconds"},
        )
        # Then it fails saying why, without running
        final = c.final(cid)
    assert final["state"] == pr.FAILURE
    assert "InvalidFormat" in final["data"]["result"]["exc_type_names"][0]
