"""WorkerTaskExecutor against in-process workers over the memory transport."""

from __future__ import annotations

import threading
import time

import pytest

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.types import failure as ft
from tests.worker_based import executor_tasks as et
from tests.worker_based.executor_helpers import (
    WAIT_S,
    FakeWorker,
    running_executor,
    running_worker,
    unique,
    wait_workers,
)

ECHO = "tests.worker_based.executor_tasks.Echo"
OTHER = "tests.worker_based.executor_tasks.Other"


def _failure(exc_obj: BaseException) -> ft.Failure:
    try:
        raise exc_obj
    except type(exc_obj):
        return ft.Failure()


def test_execute_returns_result_and_forwards_progress():
    exchange = unique()
    with (
        running_worker(exchange, "t", [et.Echo, et.Progress]),
        running_executor(exchange, ["t"]) as executor,
    ):
        events = []
        fut = executor.execute_task(
            et.Progress("p"), "u-1", {}, progress_callback=lambda *a: events.append(a)
        )
        assert fut.result(WAIT_S) == (base.EXECUTED, "done")
        assert events == [("update_progress", {"progress": 0.5})]
        fut = executor.execute_task(et.Echo("e"), "u-2", {"value": [1, "a"]})
        assert fut.result(WAIT_S) == (base.EXECUTED, [1, "a"])


def test_failure_comes_back_as_failure():
    exchange = unique()
    with running_worker(exchange, "t", [et.Fail]), running_executor(exchange, ["t"]) as executor:
        event, result = executor.execute_task(et.Fail("f"), "u-1", {}).result(WAIT_S)
        assert event == base.EXECUTED
        assert isinstance(result, ft.Failure)
        assert result.check(RuntimeError) and result.exception_str == "Woot!"


def test_revert_request_carries_result_and_failures():
    # Given a task whose execute failed elsewhere in the flow
    exchange = unique()
    failures = {"boom": _failure(RuntimeError("Woot!"))}
    with (
        running_worker(exchange, "t", [et.RevertRecorder]),
        running_executor(exchange, ["t"]) as executor,
    ):
        # When reverting it with a failure as its result and the flow failures
        fut = executor.revert_task(
            et.RevertRecorder("r"), "u-1", {}, _failure(ValueError("own")), failures
        )
        event, result = fut.result(WAIT_S)
    # Then the remote revert saw both, rebuilt from failure dicts
    assert event == base.REVERTED
    assert result == {"result": ["failure", "own"], "failures": {"boom": "Woot!"}}


def test_request_body_and_headers():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(exchange, ["t"], root_id="root-1", parent_id="p-1") as executor,
    ):
        before = time.time()
        executor.execute_task(et.Echo("e"), "u-1", {"value": 3})
        assert fake.wait_requests(1)
        data, message = fake.requests[0]
        assert data["task_cls"] == ECHO and data["arguments"] == {"value": 3}
        assert message.properties["correlation_id"] == "u-1"
        assert message.properties["reply_to"] == executor.uuid
        headers = message.headers
        assert headers[pr.HEADER_ATTEMPT] == 0
        assert before + 59 < headers[pr.HEADER_EXPIRES] < time.time() + 61
        assert headers[pr.HEADER_ROOT_ID] == "root-1"
        assert headers[pr.HEADER_PARENT_ID] == "p-1"
        assert headers[pr.HEADER_ORIGIN] == pr.make_origin()


def test_request_timeout_when_no_worker_can_take_it():
    # Given a worker that cannot run Echo, and a short transition timeout
    exchange = unique()
    with (
        running_worker(exchange, "t", [et.Other]),
        running_executor(exchange, ["t"], transition_timeout=0.2) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        started = time.monotonic()
        event, result = executor.execute_task(et.Echo("e"), "u-1", {"value": 1}).result(WAIT_S)
        took = time.monotonic() - started
    # Then the request fails with RequestTimeout, promptly
    assert event == base.EXECUTED
    assert isinstance(result, ft.Failure) and result.check(exc.RequestTimeout)
    assert "WAITING" in result.exception_str
    assert 0.15 < took < 3.0


def test_request_timeout_when_pending_and_late_replies_are_ignored():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(exchange, ["t"], transition_timeout=0.2) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
        assert fake.wait_requests(1)
        _, result = fut.result(WAIT_S)
        assert result.check(exc.RequestTimeout)
        # A worker that picks it up late is ignored (no crash, no second result)
        message = fake.requests[0][1]
        fake.reply(message, pr.RUNNING)
        fake.reply(message, pr.SUCCESS, result=5)
        # ...and the executor keeps serving
        fut = executor.execute_task(et.Echo("e"), "u-2", {"value": 2})
        assert fake.wait_requests(2)
        fake.reply(fake.requests[1][1], pr.SUCCESS, result=2)
        assert fut.result(WAIT_S) == (base.EXECUTED, 2)


def test_out_of_order_replies_complete_the_request():
    # Given a worker whose SUCCESS overtakes its RUNNING (and a late EVENT)
    exchange = unique()
    with FakeWorker(exchange, "t", [ECHO]) as fake, running_executor(exchange, ["t"]) as executor:
        events = []
        fut = executor.execute_task(
            et.Echo("e"), "u-1", {"value": 1}, progress_callback=lambda *a: events.append(a)
        )
        assert fake.wait_requests(1)
        message = fake.requests[0][1]
        fake.reply(message, pr.EVENT, event_type="update_progress", details={"progress": 1.0})
        fake.reply(message, pr.SUCCESS, result=42)
        fake.reply(message, pr.RUNNING)
        assert fut.result(WAIT_S) == (base.EXECUTED, 42)
        assert events == [("update_progress", {"progress": 1.0})]


def test_malformed_and_unknown_replies_are_survived():
    exchange = unique()
    with FakeWorker(exchange, "t", [ECHO]) as fake, running_executor(exchange, ["t"]) as executor:
        fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
        assert fake.wait_requests(1)
        message = fake.requests[0][1]
        fake.reply_raw(message, {"state": "SUCCESS"})  # no data
        fake.reply_raw(message, {"state": "FAILURE", "data": {"result": {"bad": 1}}})
        fake.reply_raw(message, {"state": "BOGUS", "data": {}})
        fake.proxy.publish(
            pr.Response(pr.SUCCESS, result=0), executor.uuid, correlation_id="nobody-asked"
        )
        fake.reply(message, pr.RUNNING)
        fake.reply(message, pr.RUNNING)  # a heartbeat repeats RUNNING
        fake.reply(message, pr.SUCCESS, result=7)
        assert fut.result(WAIT_S) == (base.EXECUTED, 7)


def test_unserialisable_arguments_fail_the_request():
    exchange = unique()
    with running_worker(exchange, "t", [et.Echo]), running_executor(exchange, ["t"]) as executor:
        assert executor.wait_for_workers(1, WAIT_S) == 0
        _, result = executor.execute_task(et.Echo("e"), "u-1", {"value": object()}).result(WAIT_S)
        assert isinstance(result, ft.Failure)
        assert result.check(exc.SerializationFailure)


def test_worker_started_after_executor_gets_waiting_request():
    # Given a request submitted while no worker exists
    exchange = unique()
    with running_executor(exchange, ["t"]) as executor:
        fut = executor.execute_task(et.Echo("e"), "u-1", {"value": "late"})
        assert not fut.done()
        # When a worker starts, it announces itself
        with running_worker(exchange, "t", [et.Echo]):
            started = time.monotonic()
            # Then the request runs at once (no NOTIFY period to wait out)
            assert fut.result(WAIT_S) == (base.EXECUTED, "late")
            assert time.monotonic() - started < 2.5  # far below the 5 s beat


def test_worker_on_unlisted_topic_is_learned_from_its_announcement():
    exchange = unique()
    with running_executor(exchange, []) as executor:
        with running_worker(exchange, "elsewhere", [et.Echo]):
            assert executor.wait_for_workers(1, WAIT_S) == 0
            assert "elsewhere" in executor.finder.topics
            assert executor.execute_task(et.Echo("e"), "u", {"value": 1}).result(WAIT_S) == (
                base.EXECUTED,
                1,
            )


def test_an_engine_given_topics_never_uses_a_worker_of_another_topic():
    # Given an engine given topic "a", and a worker of topic "b" that
    # announces itself on the same exchange before a worker of "a" does,
    exchange = unique()
    with (
        running_executor(exchange, ["a"]) as executor,
        running_worker(exchange, "b", [et.Echo]) as other,
    ):
        with running_worker(exchange, "a", [et.Echo]) as worker:
            # when the worker of "a" is known (its announcement came after b's),
            assert executor.wait_for_workers(1, WAIT_S) == 0
            # then the worker of "b" is not, and every request runs on "a".
            assert executor.finder.total_workers == 1
            assert executor.finder.topics == ["a"]
            futs = [executor.execute_task(et.Echo("e"), f"u{i}", {"value": i}) for i in range(10)]
            assert [f.result(WAIT_S)[1] for f in futs] == list(range(10))
            assert worker.server.memory.finished_count() == 10
            assert other.server.memory.finished_count() == 0


def test_heterogeneous_workers_on_one_topic():
    # Given two workers on one topic; only one of them can run Other
    # (started after the executor: each announces itself; a NOTIFY sent to a
    # shared topic queue reaches only one of its competing consumers)
    exchange = unique()
    with (
        running_executor(exchange, ["t"]) as executor,
        running_worker(exchange, "t", [et.Echo]),
        running_worker(exchange, "t", [et.Echo, et.Other]),
    ):
        assert executor.wait_for_workers(2, WAIT_S) == 0
        # When many requests of both kinds are sent
        futs = [executor.execute_task(et.Other("o"), f"o-{i}", {"value": i}) for i in range(20)]
        futs += [executor.execute_task(et.Echo("e"), f"e-{i}", {"value": i}) for i in range(20)]
        results = [f.result(WAIT_S) for f in futs]
    # Then every one ran where it could (no UnknownTask failures)
    assert [r[1] for r in results] == [2 * i for i in range(20)] + list(range(20))


def test_heterogeneous_workers_on_different_topics():
    exchange = unique()
    with (
        running_worker(exchange, "t1", [et.Echo]),
        running_worker(exchange, "t2", [et.Other]),
        running_executor(exchange, ["t1", "t2"]) as executor,
    ):
        assert executor.wait_for_workers(2, WAIT_S) == 0
        futs = [executor.execute_task(et.Other("o"), f"o-{i}", {"value": i}) for i in range(10)]
        futs += [executor.execute_task(et.Echo("e"), f"e-{i}", {"value": i}) for i in range(10)]
        results = [f.result(WAIT_S)[1] for f in futs]
    assert results == [2 * i for i in range(10)] + list(range(10))


def test_two_executors_share_one_pool_of_workers():
    exchange = unique()
    with (
        running_executor(exchange, ["t"]) as one,
        running_executor(exchange, ["t"]) as two,
        running_worker(exchange, "t", [et.Echo]),
        running_worker(exchange, "t", [et.Echo]),
    ):
        assert one.wait_for_workers(2, WAIT_S) == 0
        assert two.wait_for_workers(2, WAIT_S) == 0
        results: dict[str, list] = {}

        def submit(executor, tag):
            futs = [
                executor.execute_task(et.Echo("e"), f"{tag}-{i}", {"value": f"{tag}{i}"})
                for i in range(25)
            ]
            results[tag] = [f.result(WAIT_S)[1] for f in futs]

        threads = [
            threading.Thread(target=submit, args=(ex, tag)) for ex, tag in ((one, "a"), (two, "b"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
    assert results["a"] == [f"a{i}" for i in range(25)]
    assert results["b"] == [f"b{i}" for i in range(25)]


def test_worker_expiry_after_silence():
    # Given a worker that announced itself once, then went silent
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(exchange, ["t"], worker_expiry=0.3) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        fake.answer_notify = False
        # Then the executor forgets it after worker_expiry seconds
        started = time.monotonic()
        assert wait_workers(executor, lambda f: f.total_workers == 0)
        assert 0.25 < time.monotonic() - started < 3.0


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_live_worker_does_not_expire():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]),
        running_executor(exchange, ["t"], worker_expiry=0.6) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        # It keeps answering the NOTIFY beat (every 0.2 s): still known later
        assert not wait_workers(executor, lambda f: f.total_workers == 0, timeout=1.0)


def test_leaving_worker_is_forgotten_at_once():
    exchange = unique()
    with running_executor(exchange, ["t"]) as executor:
        with running_worker(exchange, "t", [et.Echo]):
            assert executor.wait_for_workers(1, WAIT_S) == 0
        assert wait_workers(executor, lambda f: f.total_workers == 0, timeout=2.0)


def test_stop_fails_requests_in_flight():
    exchange = unique()
    executor_cm = running_executor(exchange, ["t"])
    executor = executor_cm.__enter__()
    fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
    executor_cm.__exit__(None, None, None)
    _, result = fut.result(WAIT_S)
    assert isinstance(result, ft.Failure) and result.check(exc.ExecutionFailure)


def test_can_restart():
    exchange = unique()
    with running_worker(exchange, "t", [et.Echo]):
        with running_executor(exchange, ["t"]) as executor:
            assert executor.execute_task(et.Echo("e"), "a", {"value": 1}).result(WAIT_S)[1] == 1
            executor.stop()
            executor.start()
            assert executor.execute_task(et.Echo("e"), "b", {"value": 2}).result(WAIT_S)[1] == 2


@pytest.mark.parametrize("workers", [1, 2])
def test_wait_for_workers_counts_workers(workers):
    exchange = unique()
    with running_executor(exchange, ["t"]) as executor:
        with running_worker(exchange, "t", [et.Echo]), running_worker(exchange, "t", [et.Echo]):
            assert executor.wait_for_workers(workers, WAIT_S) == 0
        assert executor.wait_for_workers(3, timeout=0.05) > 0


# --- liveness: a RUNNING request whose worker stops sending heartbeats ---


def _liveness_executor(exchange, topics, lost_after_s=0.3, max_attempts=3):
    cm = running_executor(
        exchange, topics, policy=RequestPolicy(lost_after=lost_after_s, max_attempts=max_attempts)
    )
    executor = cm.__enter__()
    return cm, executor


def test_lost_running_request_is_dispatched_again_elsewhere():
    # Given two workers that can both run Echo
    exchange = unique()
    cond = threading.Condition()
    with (
        FakeWorker(exchange, "t1", [ECHO], cond=cond) as a,
        FakeWorker(exchange, "t2", [ECHO], cond=cond) as b,
    ):
        cm, executor = _liveness_executor(exchange, ["t1", "t2"])
        try:
            assert executor.wait_for_workers(2, WAIT_S) == 0
            fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
            with cond:
                assert cond.wait_for(lambda: a.requests or b.requests, WAIT_S)
            first, second = (a, b) if a.requests else (b, a)
            # When the first one starts it and then dies (no more heartbeats)
            first.reply(first.requests[0][1], pr.RUNNING)
            # Then the request is sent again, to the other worker, as attempt 1
            assert second.wait_requests(1)
            data, message = second.requests[0]
            assert message.headers[pr.HEADER_ATTEMPT] == 1
            assert message.properties["correlation_id"] == "u-1"
            assert data["arguments"] == {"value": 1}
            second.reply(message, pr.RUNNING)
            second.reply(message, pr.SUCCESS, result=11)
            assert fut.result(WAIT_S) == (base.EXECUTED, 11)
            # ...and the dead worker is no longer routed to
            assert [w.worker_id for w in executor.finder.workers] == [second.worker_id]
        finally:
            cm.__exit__(None, None, None)


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_lost_request_fails_after_max_attempts():
    exchange = unique()
    with FakeWorker(exchange, "t", [ECHO]) as fake:
        cm, executor = _liveness_executor(exchange, ["t"], max_attempts=2)
        try:
            assert executor.wait_for_workers(1, WAIT_S) == 0
            fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
            assert fake.wait_requests(1)
            fake.reply(fake.requests[0][1], pr.RUNNING)  # ...then silence
            # It is forgotten; when it comes back it gets the request again
            assert wait_workers(executor, lambda f: f.total_workers == 0)
            fake.announce()
            assert fake.wait_requests(2)
            fake.reply(fake.requests[1][1], pr.RUNNING)  # ...and dies again
            _, result = fut.result(WAIT_S)
            assert isinstance(result, ft.Failure) and result.check(exc.ExecutionFailure)
            assert "was lost" in result.exception_str
        finally:
            cm.__exit__(None, None, None)


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_heartbeats_keep_a_long_request_alive():
    exchange = unique()
    with FakeWorker(exchange, "t", [ECHO]) as fake:
        cm, executor = _liveness_executor(exchange, ["t"], lost_after_s=0.5)
        try:
            fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
            assert fake.wait_requests(1)
            message = fake.requests[0][1]
            beat = threading.Event()  # never set: used as a 0.1 s timer
            for _ in range(9):  # 0.9 s of running, well past lost_after_s
                fake.reply(message, pr.RUNNING)
                beat.wait(0.1)
            fake.reply(message, pr.SUCCESS, result=3)
            assert fut.result(WAIT_S) == (base.EXECUTED, 3)
            assert len(fake.requests) == 1  # never dispatched twice
        finally:
            cm.__exit__(None, None, None)


def test_taskflow_worker_without_heartbeats_is_never_declared_lost():
    exchange = unique()
    with FakeWorker(exchange, "t", [ECHO]) as fake:
        cm, executor = _liveness_executor(exchange, ["t"], lost_after_s=0.05)
        try:
            fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
            assert fake.wait_requests(1)
            message = fake.requests[0][1]
            # A RUNNING without a worker_id header (as TaskFlow's workers send)
            fake.proxy.publish(
                pr.Response(pr.RUNNING), message.properties["reply_to"], correlation_id="u-1"
            )
            assert not fake.wait_requests(2, timeout=0.4)
            fake.reply(message, pr.SUCCESS, result=5)
            assert fut.result(WAIT_S) == (base.EXECUTED, 5)
        finally:
            cm.__exit__(None, None, None)


def test_request_refused_by_a_worker_not_yet_known_is_routed_again():
    # Given a topic shared by a known worker that runs Other (reachable only
    # privately here) and an unknown one that cannot run it (it consumes the
    # topic queue, so a request routed to the topic reaches it)
    exchange = unique()

    def refuse(fake, data, message):
        try:
            raise exc.UnknownTask(f"no {data['task_cls']} here")
        except exc.UnknownTask:
            fake.reply(message, pr.FAILURE, result=ft.Failure())

    def run(fake, data, message):
        fake.reply(message, pr.RUNNING)
        fake.reply(message, pr.SUCCESS, result=data["arguments"]["value"] * 2)

    with FakeWorker(exchange, "t", [ECHO], private=True, on_request=refuse) as unknown:
        unknown.answer_notify = False  # silent to the start NOTIFY: stays unknown
        with (
            running_executor(exchange, ["t"]) as executor,
            FakeWorker(
                exchange, "t", [ECHO, OTHER], consume_topic=False, private=True, on_request=run
            ) as capable,
        ):
            capable.announce()
            assert executor.wait_for_workers(1, WAIT_S) == 0
            # (the start NOTIFY on the topic key reached it and went unanswered)
            assert unknown.wait_notifies(1)
            unknown.answer_notify = True  # ...but it answers a private probe
            # When a request for Other goes to the topic and is refused
            fut = executor.execute_task(et.Other("o"), "u-1", {"value": 4})
            # Then the executor learns the refusing worker and routes privately
            assert fut.result(WAIT_S) == (base.EXECUTED, 8)
            assert len(unknown.requests) == 1 and len(capable.requests) == 1
            assert executor.finder.total_workers == 2
            assert capable.requests[0][1].headers[pr.HEADER_ATTEMPT] == 1


def test_stop_unbinds_the_reply_queue(tmp_path):
    # Given an executor on the filesystem transport (kombu ignores auto_delete there)
    exchange = unique()
    conn = {"transport": "filesystem", "transport_options": {"data_folder": str(tmp_path)}}
    with (
        running_worker(exchange, "t", [et.Echo], **conn),
        running_executor(exchange, ["t"], **conn) as executor,
    ):
        assert executor.execute_task(et.Echo("e"), "u", {"value": 1}).result(WAIT_S)[1] == 1
        table = (tmp_path / "control" / f"{exchange}.exchange").read_text()
        reply_queue = pr.reply_queue_name(exchange, executor.uuid)
        assert reply_queue in table
        executor.stop()
        # Then its queue no longer collects announcements meant for live executors
        assert reply_queue not in (tmp_path / "control" / f"{exchange}.exchange").read_text()
