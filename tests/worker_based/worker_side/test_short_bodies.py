"""Short requests taken alone run on the consume loop's thread; everything else on the pool.

See flowengine/engines/worker_based/worker_side/short_bodies.py: a worker
owning its pool saves the hand-off to a pool thread for a request whose
class ran short lately, when no other request is held.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import short_tasks as st
import thread_tasks as tt
from wire_helpers import Client

from flowengine.engines.worker_based.wire import clock, names
from flowengine.engines.worker_based.worker_side import short_bodies as sb
from flowengine.engines.worker_based.worker_side import worker as wk
from flowengine.engines.worker_based.worker_side.middleware import Job, Middleware
from flowengine.engines.worker_based.worker_side.settings import WorkerSettings
from tests.worker_based.executor_helpers import MEMORY, unique

WAIT_S = tt.WAIT_S
CONSUME_THREAD = "flowengine-consume-a"


#: What counts as a short body in these tests: a trivial body's 1 ms bound
#: (SHORT_BODY_S) is overrun now and then on a loaded machine, where it
#: broke a streak these tests rely on (CI run 21).
TEST_SHORT_BODY_S = 0.1


@pytest.fixture(autouse=True)
def _fresh_tasks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sb, "SHORT_BODY_S", TEST_SHORT_BODY_S)
    monkeypatch.setattr(st, "LONG_BODY_S", 3 * TEST_SHORT_BODY_S)
    tt.reset()
    st.LONG.clear()
    st.WORKER = None
    yield
    tt.RELEASE.set()  # a failing test leaves no body waiting
    st.WORKER = None


@contextlib.contextmanager
def serving(worker: wk.Worker) -> Iterator[threading.Thread]:
    """Run ``worker`` in a thread until the block ends; that thread."""
    runner = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    runner.start()
    assert worker.wait(WAIT_S), "worker did not start"
    try:
        yield runner
    finally:
        tt.RELEASE.set()
        worker.stop()
        runner.join(WAIT_S)


def sent_now() -> dict[str, float]:
    """The send-time header a flowengine engine puts on each request."""
    return {names.HEADER_ENQUEUED: clock.wall()}


def run_one_by_one(
    client: Client,
    task: object,
    count: int,
    stamped: bool = True,
    settled: wk.Worker | None = None,
    on_sent: Callable[[], None] | None = None,
) -> list[str]:
    """Request ``task`` ``count`` times, each after the last was answered; thread names.

    ``stamped``: with the send time a flowengine engine gives each request
    (False: none, as TaskFlow's). ``settled``: after each answer, wait until
    that worker holds no request (a pool thread lets go of one just after
    sending its outcome), so that the next one is taken alone. ``on_sent``:
    called as each request has been sent.
    """
    ran_on = []
    for _ in range(count):
        headers = sent_now() if stamped else None
        cid = client.request(task, routing_key="a", headers=headers)
        if on_sent is not None:
            on_sent()
        reply = client.final(cid)
        assert reply["state"] == "SUCCESS", reply
        ran_on.append(reply["data"]["result"])
        if settled is not None:
            memory = settled.server.memory
            assert memory.wait_until_at_most(0, threading.Event(), WAIT_S), "request still held"
    return ran_on


def named_worker(exchange: str, *middleware: Middleware) -> wk.Worker:
    """A worker of short_tasks.Named on topic 'a' with a pool of two, and ``middleware``."""
    settings = WorkerSettings(middleware=list(middleware)) if middleware else None
    return wk.Worker(exchange, "a", [st.Named], threads_count=2, settings=settings, **MEMORY)


def assert_on_the_consume_thread_after_the_streak(ran_on: list[str]) -> None:
    """The first SHORT_STREAK requests ran on the pool, the rest on the consume loop's thread."""
    assert all(n.startswith("flowengine-pool-a") for n in ran_on[: sb.SHORT_STREAK]), ran_on
    assert ran_on[sb.SHORT_STREAK :] == [CONSUME_THREAD] * (len(ran_on) - sb.SHORT_STREAK), ran_on


def test_a_class_counts_as_short_after_a_streak_of_short_runs_and_a_long_run_resets_it():
    bodies = sb.ShortBodies(short_s=0.001, streak=2)
    # Given one short run, the class is not short yet; after two it is
    bodies.record("C", "execute", 0.0001)
    assert not bodies.is_short("C", "execute")
    bodies.record("C", "execute", 0.0001)
    assert bodies.is_short("C", "execute")
    # And the other action of the class, or another class, is not
    assert not bodies.is_short("C", "revert")
    assert not bodies.is_short("D", "execute")
    # When one run is long, the streak starts again
    bodies.record("C", "execute", 0.5)
    assert not bodies.is_short("C", "execute")


def test_short_requests_taken_alone_run_on_the_consume_thread_after_their_streak():
    exchange = unique()
    # Given a worker with a pool of its own
    worker = named_worker(exchange)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # When a short task is asked for one request at a time
        ran_on = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 3, settled=worker)
    # Then its first runs are on the pool, the rest on the consume loop's thread
    assert_on_the_consume_thread_after_the_streak(ran_on)


class LateLettingGo(Middleware):
    """Holds each pool thread, after its outcome went out, until the next request arrives.

    As a loaded machine may: the thread that sent an outcome lets go of its
    request only after the engine got it and sent the chain's next one.
    """

    def __init__(self) -> None:
        self.received = 0
        self._arrived = threading.Condition()

    def after_receive(self, job: Job) -> None:
        with self._arrived:
            self.received += 1
            self._arrived.notify_all()

    def after_release(self, job: Job) -> None:
        if not threading.current_thread().name.startswith("flowengine-pool"):
            return
        with self._arrived:
            seen = self.received
            self._arrived.wait_for(lambda: self.received > seen, timeout=WAIT_S)


def test_a_request_whose_outcome_went_out_does_not_keep_the_next_off_the_consume_thread():
    exchange = unique()
    # Given a worker whose pool threads let go of a request only once the
    # next one arrived (the outcome of each is on its way by then),
    worker = named_worker(exchange, LateLettingGo())
    with Client(exchange, **MEMORY) as client, serving(worker):
        # when a short task is asked for one request after the other, as
        # an engine's chain does (no waiting for the worker to settle),
        ran_on = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 3)
    # then once its streak is made it runs on the consume loop's thread:
    # the request still held by a pool thread was answered.
    assert_on_the_consume_thread_after_the_streak(ran_on)


#: How long SlowAfterAnswering's loop goes on after the next request was sent.
LINGER_S = 0.05


class SlowAfterAnswering(Middleware):
    """Keeps the consume loop, after a request it ran went out, until the next is sent.

    As a loaded machine may: the loop's log line and hooks after an outcome
    outlast the engine's reaction to that outcome.
    """

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self._changed = threading.Condition()

    def request_sent(self) -> None:
        with self._changed:
            self.sent += 1
            self._changed.notify_all()

    def after_receive(self, job: Job) -> None:
        with self._changed:
            self.received += 1

    def after_release(self, job: Job) -> None:
        if threading.current_thread().name != CONSUME_THREAD:
            return
        with self._changed:
            self._changed.wait_for(lambda: self.sent > self.received, timeout=WAIT_S)
        # The slow part itself (not a synchronisation): on after the next
        # request was sent for longer than that request's trip here.
        time.sleep(LINGER_S)


def test_a_chains_next_request_runs_on_the_consume_thread_however_long_the_loop_lingers():
    exchange = unique()
    # Given a worker whose consume loop lingers after each request it ran
    # until the engine sent the next one,
    slow = SlowAfterAnswering()
    worker = named_worker(exchange, slow)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # when a short task is asked for one request after the other,
        ran_on = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 3, on_sent=slow.request_sent)
        slow.request_sent()  # lets the loop go on from the last one
    # then each request after the streak still counts as a chain's next
    # (the loop's time with the one before ended when that one was answered).
    assert_on_the_consume_thread_after_the_streak(ran_on)


def test_a_long_body_sends_its_class_back_to_the_pool():
    exchange = unique()
    worker = named_worker(exchange)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # Given a class whose requests run on the consume loop's thread
        assert (
            run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 1, settled=worker)[-1]
            == CONSUME_THREAD
        )
        # When one of its bodies runs long (there, once)
        st.LONG.set()
        assert run_one_by_one(client, st.Named(), 1, settled=worker) == [CONSUME_THREAD]
        st.LONG.clear()
        # Then its next requests run on the pool until it ran short often enough again
        ran_on = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 1, settled=worker)
    assert all(n.startswith("flowengine-pool-a") for n in ran_on[: sb.SHORT_STREAK]), ran_on
    assert ran_on[-1] == CONSUME_THREAD


def test_a_short_request_goes_to_the_pool_while_another_is_held():
    exchange = unique()
    worker = wk.Worker(exchange, "a", [st.Named, tt.Hold], threads_count=2, **MEMORY)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # Given a short class, and a request of another class running
        run_one_by_one(client, st.Named(), sb.SHORT_STREAK, settled=worker)
        held = client.request(tt.Hold(), routing_key="a")
        assert tt.wait_started(1)
        # When the short class is asked for meanwhile
        ran_on = run_one_by_one(client, st.Named(), 2)
        # Then it runs on the pool: the consume loop stays free
        assert all(n.startswith("flowengine-pool-a") for n in ran_on), ran_on
        tt.RELEASE.set()
        assert client.final(held)["state"] == "SUCCESS"


def test_a_worker_given_an_executor_runs_every_body_on_it():
    exchange = unique()
    pool = cf.ThreadPoolExecutor(2, thread_name_prefix="callers-pool")
    # Given a worker running bodies on the caller's executor
    worker = wk.Worker(exchange, "a", [st.Named], executor=pool, **MEMORY)
    try:
        with Client(exchange, **MEMORY) as client, serving(worker):
            # When a short task is asked for one request at a time
            ran_on = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 3)
    finally:
        pool.shutdown()
    # Then every body ran on that executor
    assert all(n.startswith("callers-pool") for n in ran_on), ran_on


def test_a_short_request_that_stops_its_worker_from_the_consume_thread_is_answered():
    exchange = unique()
    before = set(threading.enumerate())
    worker = wk.Worker(exchange, "a", [st.NamedStopper], threads_count=2, **MEMORY)
    with Client(exchange, **MEMORY) as client, serving(worker) as runner:
        # Given a short class whose requests run on the consume loop's thread
        ran_on = run_one_by_one(client, st.NamedStopper(), sb.SHORT_STREAK + 1, settled=worker)
        assert ran_on[-1] == CONSUME_THREAD
        # When its next body stops the worker there
        st.WORKER = worker
        reply = client.final(client.request(st.NamedStopper(), routing_key="a", headers=sent_now()))
        # Then it is answered, and the worker's run() returns
        assert (reply["state"], reply["data"]["result"]) == ("SUCCESS", CONSUME_THREAD)
        runner.join(WAIT_S)
        assert not runner.is_alive()
    # And every thread it started ends
    for thread in threading.enumerate():
        if thread not in before:
            thread.join(WAIT_S)
    assert [t.name for t in threading.enumerate() if t not in before] == []


def test_requests_sent_together_or_without_a_send_time_go_to_the_pool():
    exchange = unique()
    worker = named_worker(exchange)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # Given a short class whose requests run on the consume loop's thread
        assert (
            run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 1, settled=worker)[-1]
            == CONSUME_THREAD
        )
        # When requests come without a send time (as TaskFlow's engines send them)
        unstamped = run_one_by_one(client, st.Named(), 2, stamped=False)
        # Then they run on the pool
        assert all(n.startswith("flowengine-pool-a") for n in unstamped), unstamped
        # And when several are sent at once (a burst, queued behind each other)
        run_one_by_one(client, st.Named(), 1)
        burst_sent = sent_now()
        cids = [client.request(st.Named(), routing_key="a", headers=burst_sent) for _ in range(4)]
        ran_on = [client.final(cid)["data"]["result"] for cid in cids]
    # Then all but the first run on the pool: the loop takes the next meanwhile
    assert all(n.startswith("flowengine-pool-a") for n in ran_on[1:]), ran_on


def test_pace_tells_a_chains_next_request_from_one_queued_behind():
    pace = sb.Pace()
    # Given nothing taken yet, no request counts as a chain's next
    assert not pace.follows_last("engine", 100.0)
    # When the loop spent 2 ms on a request sent at 100.0
    pace.took("engine", 100.0, 0.002)
    # Then one sent 5 ms later follows it; one sent 1 ms later was queued behind it
    assert pace.follows_last("engine", 100.005)
    assert not pace.follows_last("engine", 100.001)
    # And one of another engine, or without a send time, never follows it
    assert not pace.follows_last("other", 100.005)
    assert not pace.follows_last("engine", None)
    # And after a request without a send time nothing follows
    pace.took("engine", None, 0.001)
    assert not pace.follows_last("engine", 200.0)
