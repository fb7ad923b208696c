"""Silence the executor could not hear through is forgiven when its consumer is back.

During a broker outage nobody hears anybody. When the executor's reply
consumer consumes again, every held request has been silent since before
the outage; the workers' heartbeats resume a moment later. Each held
request's silence clock therefore restarts when consuming resumes: it is
lost only if the silence goes on for a full loss bound after that.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import types
import uuid
from typing import Any

import pytest

from flowengine import engines, task
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.housekeeper import Housekeeper
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.engines.worker_based.executor_side.remote_stats import RemoteStatistics
from flowengine.patterns import linear_flow as lf
from tests import waiting
from tests.worker_based import executor_tasks as et
from tests.worker_based.executor_helpers import running_executor, running_worker, unique

#: Loss bound of the unit tests (s); only compared with, never waited for.
BOUND_S = 2.0

#: Integration test: the workers' heartbeat interval (s) and the misses the
#: executor allows, so the loss bound is 4.5 s: a live worker has 3 s after
#: the grace to be heard again. (Without the grace the request is due the
#: moment consuming resumes; whether it is then declared lost depends on a
#: race with the first heartbeat, so the test checks that moment directly.)
HEARTBEAT_S = 1.5
MISSES = 3
LOST_AFTER_S = HEARTBEAT_S * MISSES

#: How long the broker stays down: longer than the loss bound (the scenario).
OUTAGE_S = LOST_AFTER_S + 1.0

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 60.0
POLL_S = 0.02
#: The engine every request of the book-level tests belongs to.
_OWNER = tr.Owner(RemoteStatistics())

#: tests.waiting.wait_until with this module's bound and pace.
_wait_until = functools.partial(waiting.wait_until, timeout=WAIT_S, poll_s=POLL_S)


class _OneTopicFinder:
    """Routes every task to topic 't' (all a RequestBook asks of its finder)."""

    def get_route_for_task(self, task: Any) -> tuple[Any, str]:
        return types.SimpleNamespace(topic="t"), "t"


def _held(book: tr.RequestBook, silent_for_s: float = 0.0) -> tr.Tracked:
    """A request RUNNING on worker 'w1', last heard ``silent_for_s`` seconds ago."""
    request = pr.Request(et.Echo("e"), uuid.uuid4().hex, pr.EXECUTE, {"value": 1}, timeout=None)
    tracked = tr.Tracked(request, None, None, _OWNER)
    route, _ = book.submit(tracked)
    assert route is not None
    with book.lock:
        assert tr.transition(tracked, pr.RUNNING)
        book.heard(tracked, "w1", BOUND_S)
        tracked.last_heard -= silent_for_s
    return tracked


def _lost_at(book: tr.RequestBook, now: float) -> list[tr.Tracked]:
    return book.scan(now)[1]


# --- the book ---


def test_held_request_is_not_lost_right_after_the_grace_but_after_a_full_bound():
    # Given a held request silent for longer than its bound (as after an outage)
    book = tr.RequestBook(_OneTopicFinder(), None)
    tracked = _held(book, silent_for_s=BOUND_S * 3)
    now = time.monotonic()
    assert _lost_at(book, now) == [tracked]  # without the grace it would be lost now
    # When the executor can hear again at `now`
    assert book.forgive(now) == 1
    # Then it is not lost now, nor just before a full bound after `now`...
    assert _lost_at(book, now) == []
    assert _lost_at(book, now + BOUND_S - 0.001) == []
    assert book.next_deadline == pytest.approx(now + BOUND_S)
    # ...and it is lost once the silence has lasted the full bound after `now`
    assert _lost_at(book, now + BOUND_S) == [tracked]


def test_grace_only_covers_held_requests_and_never_moves_a_clock_back():
    book = tr.RequestBook(_OneTopicFinder(), None)
    now = time.monotonic()
    # A request published but not heard from (no worker holds it yet)
    unheard = tr.Tracked(
        pr.Request(et.Echo("e"), "unheard", pr.EXECUTE, {"value": 1}, timeout=None),
        None,
        None,
        _OWNER,
    )
    book.submit(unheard)
    # A request heard from after the moment the grace is given for
    later = _held(book)
    heard_at = later.last_heard
    assert book.forgive(now - 1.0) == 1  # only the held one counts
    assert unheard.last_heard is None
    assert later.last_heard == heard_at


# --- the housekeeper's consumer callback ---


@pytest.fixture
def housekeeper():
    """A housekeeper (never run) whose book routes everything to topic 't'."""
    book = tr.RequestBook(_OneTopicFinder(), None)
    return Housekeeper(
        "executor-1", book, finder=None, policy=RequestPolicy(), requests=None, unserved_watch=None
    )


def test_consumer_restart_after_an_outage_forgives_but_first_start_does_not(housekeeper, caplog):
    caplog.set_level(logging.INFO, logger="flowengine.engines.worker_based.executor_side")
    # Given a held request long silent
    tracked = _held(housekeeper.book, silent_for_s=BOUND_S * 3)
    before = tracked.last_heard
    # When consuming starts for the first time (no reconnection yet): nothing is forgiven
    housekeeper.consumer_started(0, None)
    assert tracked.last_heard == before
    # When it starts again after an outage
    back = time.monotonic()
    housekeeper.consumer_started(1, 7.5)
    # Then the silence clock restarts then, and the user is told
    assert tracked.last_heard >= back
    assert "after 7.5 s without a broker connection" in caplog.text
    assert "the silence clock of 1 held request(s) restarts now" in caplog.text
    # And it is given once per reconnection
    given = tracked.last_heard
    housekeeper.consumer_started(1, 7.5)
    assert tracked.last_heard == given


def test_loss_found_just_before_the_grace_is_not_acted_on(housekeeper):
    # Given the scanner found a held request lost just before the consumer came back
    tracked = _held(housekeeper.book, silent_for_s=BOUND_S * 3)
    found_at = time.monotonic()
    assert _lost_at(housekeeper.book, found_at) == [tracked]
    housekeeper.consumer_started(1, 1.0)
    housekeeper._consumer_tick = time.monotonic() + BOUND_S * 10  # consumer caught up
    # When the scanner acts on what it found
    housekeeper._recover_lost(tracked, found_at)
    # Then nothing happens: not lost, not dispatched again
    assert list(housekeeper.lost_history) == []
    assert tracked.attempt == 0 and tracked.worker_id == "w1"


# --- a real broker outage ---


class _Signals:
    """What Hold reports to the test, and the test's go-ahead (reset per test)."""

    runs: list[Any] = []
    started = threading.Event()
    release = threading.Event()

    @classmethod
    def reset(cls) -> None:
        cls.runs = []
        cls.started = threading.Event()
        cls.release = threading.Event()


class Hold(task.Task):
    """Records that it runs, then waits (bounded) for the test's go-ahead."""

    def execute(self, value: Any) -> Any:
        _Signals.runs.append(value)
        _Signals.started.set()
        if not _Signals.release.wait(WAIT_S):
            raise RuntimeError("the test never let Hold finish")
        return value


def _record_heard(executor: wex.WorkerTaskExecutor) -> list[tuple[int, tr.Tracked]]:
    """Record each heartbeat the executor handles, with its reconnections so far."""
    heard: list[tuple[int, tr.Tracked]] = []
    book = executor.book
    original = book.heard

    def recording(tracked: tr.Tracked, worker_id: Any, lost_after_s: float) -> bool:
        heard.append((executor.proxy.reconnect_count, tracked))
        return original(tracked, worker_id, lost_after_s)

    book.heard = recording  # type: ignore[method-assign]
    return heard


def _record_consumer_starts(
    executor: wex.WorkerTaskExecutor, tracked: tr.Tracked
) -> list[tuple[float, float | None]]:
    """Record (when, ``tracked.last_heard``) each time consuming resumes.

    Taken right after the executor's own callback, before the consumer reads
    anything on its new connection: what the scanner would see at that moment.
    """
    starts: list[tuple[float, float | None]] = []
    housekeeper = executor.housekeeper
    callback = housekeeper.consumer_started

    def recording(reconnects: int, outage_s: float | None) -> None:
        callback(reconnects, outage_s)
        starts.append((time.monotonic(), tracked.last_heard))

    housekeeper.consumer_started = recording  # type: ignore[method-assign]
    return starts


@pytest.mark.broker
@pytest.mark.slow
def test_outage_longer_than_the_loss_bound_does_not_run_the_task_twice(private_redis, caplog):
    caplog.set_level(logging.INFO, logger="flowengine.engines.worker_based.executor_side")
    _Signals.reset()
    exchange, topic = unique(), "grace"
    conn = {"url": private_redis.url}
    flow = lf.Flow("grace").add(Hold(name="hold", inject={"value": 7}))
    errors: list[BaseException] = []
    done = threading.Event()
    # Given two workers that can run Hold, and an executor allowing 3 misses
    with (
        running_worker(exchange, topic, [Hold], heartbeat_interval=HEARTBEAT_S, **conn),
        running_worker(exchange, topic, [Hold], heartbeat_interval=HEARTBEAT_S, **conn),
        running_executor(
            exchange, [topic], policy=RequestPolicy(heartbeat_misses=MISSES), **conn
        ) as executor,
    ):
        try:
            assert executor.wait_for_workers(2, WAIT_S) == 0
            heard = _record_heard(executor)
            engine = engines.load(flow, engine="worker-based", executor=executor)

            def run() -> None:
                try:
                    engine.run()
                except BaseException as e:  # reported by the test thread
                    errors.append(e)
                finally:
                    done.set()

            threading.Thread(target=run, daemon=True).start()
            # ...and Hold running on one of them, its RUNNING heard
            assert _Signals.started.wait(WAIT_S)
            _wait_until(
                lambda: any(t.request.current_state == pr.RUNNING for _, t in heard),
                "its RUNNING heard",
            )
            tracked = heard[-1][1]
            assert tracked.lost_after == pytest.approx(LOST_AFTER_S)
            starts = _record_consumer_starts(executor, tracked)
            # When the broker is down for longer than the loss bound
            private_redis.kill()
            threading.Event().wait(OUTAGE_S)  # the outage itself, not a synchronisation
            assert time.monotonic() - tracked.last_heard > tracked.lost_after
            private_redis.start()
            # Then, the moment the executor's consumer is back, the request is not due
            _wait_until(lambda: starts, "the consumer back")
            back_at, last_heard = starts[0]
            assert last_heard is not None and last_heard + tracked.lost_after > back_at
            # ...and the executor hears a heartbeat again
            _wait_until(
                lambda: any(reconnects >= 1 for reconnects, _ in heard),
                "a heartbeat after the reconnection",
            )
            # And the request was never declared lost (nor dispatched again)
            assert list(executor.lost_history) == []
            assert tracked.attempt == 0
            # And once Hold finishes, the flow succeeds with its one run
            _Signals.release.set()
            assert done.wait(WAIT_S), "the flow did not finish"
            assert not errors, errors
        finally:
            _Signals.release.set()  # never leave a worker thread blocked
    assert _Signals.runs == [7]
    assert engine.storage.get("hold") == 7
    assert "the silence clock of 1 held request(s) restarts now" in caplog.text
