"""Fast, in-process checks of the pieces behind the fault tests (memory transport).

Worker memory (duplicates), fencing of superseded attempts, giving up with
RequestLost, the run time limit, the broadcast NOTIFY and the request
context available to task code.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.worker_side import context, held
from flowengine.types import failure as ft
from tests.reliability import fault_tasks
from tests.worker_based import executor_tasks as et
from tests.worker_based.executor_helpers import (
    WAIT_S,
    FakeWorker,
    running_executor,
    running_worker,
    unique,
    wait_workers,
)
from tests.worker_based.wire_helpers import Client

ECHO = "tests.worker_based.executor_tasks.Echo"


# --- the worker's memory of requests ---


def _finish(memory: held.RequestMemory, key: held.Key, body: dict) -> None:
    """Finish ``key`` with ``body`` and its size as a worker sends it (JSON)."""
    memory.finish(key, body, len(json.dumps(body)))


def test_memory_answers_duplicates_of_held_and_finished_requests():
    memory = held.RequestMemory()
    key = ("u", pr.EXECUTE, "sub-1")
    assert memory.admit(key, "r", 0).kind == held.NEW
    assert memory.admit(key, "r", 0).kind == held.HELD
    # A newer attempt of a held request is adopted (its replies carry it)...
    assert memory.admit(key, "r", 1).held.attempt == 1
    # ...an older one is stale
    assert memory.admit(key, "r", 0).kind == held.STALE
    _finish(memory, key, {"state": pr.SUCCESS, "data": {"result": 5}})
    verdict = memory.admit(key, "r", 2)
    assert verdict.kind == held.FINISHED and verdict.finished.outcome["data"]["result"] == 5
    # The revert of the same task uuid, or a Retry's new submission, is new
    assert memory.admit(("u", pr.REVERT, "sub-1"), "r", 0).kind == held.NEW
    assert memory.admit(("u", pr.EXECUTE, "sub-2"), "r", 0).kind == held.NEW


def test_memory_is_bounded_in_count_time_and_size():
    memory = held.RequestMemory(max_finished=2, keep_s=60.0, max_outcome_bytes=50)
    for i in range(3):
        key = (f"u{i}", pr.EXECUTE, "s")
        memory.admit(key, "r", 0)
        _finish(memory, key, {"state": pr.SUCCESS, "data": {"result": i}})
    assert memory.finished_count() == 2
    assert memory.admit(("u0", pr.EXECUTE, "s"), "r", 0).kind == held.NEW  # evicted
    big = ("big", pr.EXECUTE, "s")
    memory.admit(big, "r", 0)
    _finish(memory, big, {"state": pr.SUCCESS, "data": {"result": "x" * 100}})
    assert memory.admit(big, "r", 0).finished.outcome is None  # remembered, not kept
    # Without a submission id (TaskFlow executors) nothing finished is remembered
    anon = ("anon", pr.EXECUTE, None)
    memory.admit(anon, "r", None)
    _finish(memory, anon, {"state": pr.SUCCESS, "data": {"result": 1}})
    assert memory.admit(anon, "r", None).kind == held.NEW
    expiring = held.RequestMemory(keep_s=0.0)
    key = ("e", pr.EXECUTE, "s")
    expiring.admit(key, "r", 0)
    _finish(expiring, key, {"state": pr.SUCCESS, "data": {"result": 1}})
    assert expiring.admit(key, "r", 0).kind == held.NEW


def test_liveness_helpers():
    assert lv.broadcast_routing_key("t") == "t.broadcast"
    assert lv.lost_after(0.5, 3) == 1.5
    assert lv.parse_heartbeat("0.25") == 0.25
    assert lv.parse_heartbeat(0) is None and lv.parse_heartbeat(True) is None
    with pytest.raises(ValueError):
        lv.check_interval(0.001)
    deadline = time.monotonic() + 10.0
    # expires is a little earlier than the engine's deadline (10% of 10 s, at most 1 s)
    assert 8.8 < lv.expires_at(deadline, 10.0) - time.time() < 9.1


# --- executor: fencing, giving up, run time limit ---


def test_replies_from_a_superseded_attempt_are_ignored(caplog):
    caplog.set_level(logging.INFO, logger="flowengine.engines.worker_based.executor_side")
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(exchange, ["t"], lost_after=0.2) as executor,
    ):
        fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
        assert fake.wait_requests(1)
        first = fake.requests[0][1]
        fake.reply(first, pr.RUNNING)  # ...then silence: lost, dispatched again
        assert wait_workers(executor, lambda f: f.total_workers == 0)
        fake.announce()  # it comes back (as another worker would take over)
        assert fake.wait_requests(2)
        second = fake.requests[1][1]
        assert second.headers[pr.HEADER_ATTEMPT] == 1
        assert second.headers[lv.HEADER_REQUEST_ID] == first.headers[lv.HEADER_REQUEST_ID]
        # When the first attempt answers late, it is ignored...
        fake.proxy.publish(
            pr.Response(pr.SUCCESS, result="stale"),
            first.properties["reply_to"],
            correlation_id="u-1",
            headers={pr.HEADER_WORKER_ID: fake.worker_id, pr.HEADER_ATTEMPT: 0},
        )
        # ...and the current one decides
        fake.proxy.publish(
            pr.Response(pr.SUCCESS, result="fresh"),
            first.properties["reply_to"],
            correlation_id="u-1",
            headers={pr.HEADER_WORKER_ID: fake.worker_id, pr.HEADER_ATTEMPT: 1},
        )
        assert fut.result(WAIT_S) == (base.EXECUTED, "fresh")
    assert "superseded by attempt 1" in caplog.text


def test_pending_holder_lost_every_time_gives_request_lost():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(exchange, ["t"], lost_after=0.1, max_attempts=2) as executor,
    ):
        fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
        for n in (1, 2):
            assert fake.wait_requests(n)
            fake.reply(fake.requests[n - 1][1], pr.PENDING)  # taken, then silence
            if n == 1:
                assert wait_workers(executor, lambda f: f.total_workers == 0)
                fake.announce()  # forgotten as dead; comes back
        _, result = fut.result(WAIT_S)
    assert isinstance(result, ft.Failure) and result.check(exc.RequestLost)
    assert "max_attempts=2" in result.exception_str
    assert [r.attempt for r in executor.lost_history] == [0, 1]


def test_run_timeout_fails_a_request_running_too_long():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(exchange, ["t"], run_timeout=0.2) as executor,
    ):
        fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
        assert fake.wait_requests(1)
        fake.reply(fake.requests[0][1], pr.RUNNING)
        _, result = fut.result(WAIT_S)
    assert isinstance(result, ft.Failure) and result.check(exc.RequestTimeout)
    assert "run_timeout" in result.exception_str


def test_bad_liveness_options_are_refused():
    for bad in (
        {"heartbeat_misses": 0},
        {"max_attempts": 0},
        {"run_timeout": 0},
        {"lost_after": -1},
        {"heartbeat_interval": "x"},
    ):
        with pytest.raises(ValueError):
            running_executor(unique(), ["t"], **bad).__enter__()


# --- discovery broadcast ---


def test_notify_on_the_broadcast_key_reaches_every_worker_of_the_topic():
    exchange = unique()
    conn = {"transport": "memory"}
    with (
        running_worker(exchange, "t", [et.Echo]) as a,
        running_worker(exchange, "t", [et.Echo]) as b,
        Client(exchange, **conn) as client,
    ):
        ids = {a.worker_id, b.worker_id}
        client.proxy.publish(
            pr.Notify(), lv.broadcast_routing_key("t"), reply_to=client.uuid, correlation_id="probe"
        )
        # Answers to this probe, not periodic announcements (which say the same)
        assert client.wait_for(
            lambda: ids <= {h.get(pr.HEADER_WORKER_ID) for _d, h in client.answers("probe")}
        )
        # Each answer advertises the worker's heartbeat interval
        assert all(
            h[lv.HEADER_HEARTBEAT] == lv.HEARTBEAT_INTERVAL_S for _d, h in client.answers("probe")
        )


# --- what task code can know ---


def test_task_code_sees_its_request_uuid_and_attempt():
    exchange = unique()
    with (
        running_worker(exchange, "t", [fault_tasks.WhoAmI]) as worker,
        running_executor(exchange, ["t"]) as executor,
    ):
        _, seen = executor.execute_task(fault_tasks.WhoAmI("who"), "u-7", {}).result(WAIT_S)
    assert seen["uuid"] == "u-7" and seen["action"] == pr.EXECUTE
    assert seen["attempt"] == 0 and seen["worker_id"] == worker.worker_id
    assert seen["request_id"]
    assert context.current() is None  # outside a worker's task


def test_worker_holds_at_most_capacity_plus_one(monkeypatch):
    # Given a worker with one thread (capacity 2) and a task that blocks
    exchange = unique()
    release = threading.Event()
    started = threading.Event()

    class Hold(et.Echo):
        def execute(self, value):
            started.set()
            release.wait(WAIT_S)
            return value

    monkeypatch.setattr(et, "Hold", Hold, raising=False)
    Hold.__module__, Hold.__qualname__ = et.__name__, "Hold"
    conn = {"transport": "memory"}
    with (
        running_worker(exchange, "t", [Hold], threads=1) as worker,
        Client(exchange, **conn) as client,
    ):
        assert worker.server.capacity == 2
        # When five requests are sent to its topic
        cids = [
            client.request(
                Hold(), arguments={"value": i}, routing_key="t", headers={pr.HEADER_ATTEMPT: 0}
            )
            for i in range(5)
        ]
        assert started.wait(WAIT_S)
        # Then it takes three (capacity + 1), each told PENDING, and leaves the rest
        assert client.wait_for(lambda: sum(pr.PENDING in client.states(c) for c in cids) == 3)
        assert worker.server.running_count == 3
        release.set()
        assert all(client.final(c)["state"] == pr.SUCCESS for c in cids)
