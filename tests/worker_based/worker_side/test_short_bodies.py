"""Short requests taken alone run on the consume loop's thread; everything else on the pool.

See flowengine/engines/worker_based/worker_side/short_bodies.py: a worker
owning its pool saves the hand-off to a pool thread for a request whose
class ran short lately, when no other request is held.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
from collections.abc import Iterator

import pytest
import short_tasks as st
import thread_tasks as tt
from wire_helpers import Client

from flowengine.engines.worker_based.worker_side import short_bodies as sb
from flowengine.engines.worker_based.worker_side import worker as wk
from tests.worker_based.executor_helpers import MEMORY, unique

WAIT_S = tt.WAIT_S
CONSUME_THREAD = "flowengine-consume-a"


@pytest.fixture(autouse=True)
def _fresh_tasks() -> Iterator[None]:
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


def run_one_by_one(client: Client, task: object, count: int) -> list[str]:
    """Request ``task`` ``count`` times, each after the last was answered; thread names."""
    names = []
    for _ in range(count):
        reply = client.final(client.request(task, routing_key="a"))
        assert reply["state"] == "SUCCESS", reply
        names.append(reply["data"]["result"])
    return names


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
    worker = wk.Worker(exchange, "a", [st.Named], threads_count=2, **MEMORY)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # When a short task is asked for one request at a time
        names = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 3)
    # Then its first runs are on the pool, the rest on the consume loop's thread
    assert all(n.startswith("flowengine-pool-a") for n in names[: sb.SHORT_STREAK]), names
    assert names[sb.SHORT_STREAK :] == [CONSUME_THREAD] * 3


def test_a_long_body_sends_its_class_back_to_the_pool():
    exchange = unique()
    worker = wk.Worker(exchange, "a", [st.Named], threads_count=2, **MEMORY)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # Given a class whose requests run on the consume loop's thread
        assert run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 1)[-1] == CONSUME_THREAD
        # When one of its bodies runs long (there, once)
        st.LONG.set()
        assert run_one_by_one(client, st.Named(), 1) == [CONSUME_THREAD]
        st.LONG.clear()
        # Then its next requests run on the pool until it ran short often enough again
        names = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 1)
    assert all(n.startswith("flowengine-pool-a") for n in names[: sb.SHORT_STREAK]), names
    assert names[-1] == CONSUME_THREAD


def test_a_short_request_goes_to_the_pool_while_another_is_held():
    exchange = unique()
    worker = wk.Worker(exchange, "a", [st.Named, tt.Hold], threads_count=2, **MEMORY)
    with Client(exchange, **MEMORY) as client, serving(worker):
        # Given a short class, and a request of another class running
        run_one_by_one(client, st.Named(), sb.SHORT_STREAK)
        held = client.request(tt.Hold(), routing_key="a")
        assert tt.wait_started(1)
        # When the short class is asked for meanwhile
        names = run_one_by_one(client, st.Named(), 2)
        # Then it runs on the pool: the consume loop stays free
        assert all(n.startswith("flowengine-pool-a") for n in names), names
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
            names = run_one_by_one(client, st.Named(), sb.SHORT_STREAK + 3)
    finally:
        pool.shutdown()
    # Then every body ran on that executor
    assert all(n.startswith("callers-pool") for n in names), names


def test_a_short_request_that_stops_its_worker_from_the_consume_thread_is_answered():
    exchange = unique()
    before = set(threading.enumerate())
    worker = wk.Worker(exchange, "a", [st.NamedStopper], threads_count=2, **MEMORY)
    with Client(exchange, **MEMORY) as client, serving(worker) as runner:
        # Given a short class whose requests run on the consume loop's thread
        assert run_one_by_one(client, st.NamedStopper(), sb.SHORT_STREAK + 1)[-1] == (
            CONSUME_THREAD
        )
        # When its next body stops the worker there
        st.WORKER = worker
        reply = client.final(client.request(st.NamedStopper(), routing_key="a"))
        # Then it is answered, and the worker's run() returns
        assert (reply["state"], reply["data"]["result"]) == ("SUCCESS", CONSUME_THREAD)
        runner.join(WAIT_S)
        assert not runner.is_alive()
    # And every thread it started ends
    for thread in threading.enumerate():
        if thread not in before:
            thread.join(WAIT_S)
    assert [t.name for t in threading.enumerate() if t not in before] == []
