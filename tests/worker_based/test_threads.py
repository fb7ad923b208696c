"""Thread inventory: every thread a worker or an engine starts, by name, and none after stop().

Counted live (doc/source/architecture.rst, "Threads", lists them): a worker
of 4 threads serving one topic runs 8 threads of its own while 4 requests
run (a consume loop, a heartbeat and a fence thread per topic, one control
loop, the pool's 4); each further topic adds 3. An engine runs 3 while a
flow runs (its reply consumer, its request sender, its housekeeping).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import thread_tasks as tt
from wire_helpers import Client

from flowengine import engines
from flowengine.engines.worker_based.worker_side import worker as wk
from flowengine.patterns import linear_flow as lf
from tests.worker_based.executor_helpers import MEMORY, unique

WAIT_S = tt.WAIT_S
POOL = 4


@pytest.fixture(autouse=True)
def _fresh_tasks() -> Iterator[None]:
    tt.reset()
    yield
    tt.RELEASE.set()  # a failing test leaves no body waiting


def started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads alive now that were not alive in ``before``."""
    return [t for t in threading.enumerate() if t not in before]


@contextlib.contextmanager
def serving(worker: wk.Worker) -> Iterator[threading.Thread]:
    """Run ``worker`` in a thread of the test's own until the block ends; that thread."""
    runner = threading.Thread(
        target=worker.run, kwargs={"display_banner": False}, name="test-runner", daemon=True
    )
    runner.start()
    assert worker.wait(WAIT_S), "worker did not start"
    try:
        yield runner
    finally:
        tt.RELEASE.set()
        worker.stop()
        runner.join(WAIT_S)


def worker_threads(worker: wk.Worker) -> set[str]:
    """The names every thread of ``worker`` must have while POOL requests run."""
    first = worker.topics[0]
    names = {f"flowengine-control-{worker.worker_id}"}
    names.update(f"flowengine-pool-{first}_{n}" for n in range(POOL))
    for topic in worker.topics:
        names.update(
            {
                f"flowengine-consume-{topic}",
                f"flowengine-heartbeat-{topic}",
                f"flowengine-fence-{topic}",
            }
        )
    return names


@pytest.mark.parametrize("topics", [["a"], ["a", "b"]], ids=["one topic", "two topics"])
def test_a_worker_runs_named_threads_and_none_is_left_after_stop(topics):
    exchange = unique()
    # Given a worker of 4 threads serving its topics, and 4 requests running
    with Client(exchange, **MEMORY) as client:
        before = set(threading.enumerate())
        worker = wk.Worker(exchange, topics, [tt.Hold], threads_count=POOL, **MEMORY)
        with serving(worker) as runner:
            cids = [
                client.request(tt.Hold(), routing_key=topics[n % len(topics)]) for n in range(POOL)
            ]
            assert tt.wait_started(POOL)
            # When its threads are counted
            running = [t for t in started_since(before) if t is not runner]
            # Then each is named after its role, and these are all there are
            assert sorted(t.name for t in running) == sorted(worker_threads(worker))
            assert len(running) == POOL + 1 + 3 * len(topics)
            tt.RELEASE.set()
            for cid in cids:
                assert client.final(cid)["state"] == "SUCCESS"
            # And when it is stopped (its requests answered), none is left
            worker.stop()
            assert [t.name for t in running if t.is_alive()] == []
        assert not runner.is_alive()


def test_time_limits_and_events_add_their_threads_and_none_is_left_after_stop():
    exchange = unique()
    # Given a worker with default time limits and events, and a request running
    with Client(exchange, **MEMORY) as client:
        before = set(threading.enumerate())
        worker = wk.Worker(
            exchange,
            "a",
            [tt.Hold],
            threads_count=POOL,
            events=True,
            soft_time_limit=3600,
            **MEMORY,
        )
        with serving(worker) as runner:
            cid = client.request(tt.Hold(), routing_key="a")
            assert tt.wait_started(1)
            # When its threads are counted
            running = [t for t in started_since(before) if t is not runner]
            # Then the time-limit and event threads are there too, named
            first_pool_thread_only = {f"flowengine-pool-a_{n}" for n in range(1, POOL)}
            assert sorted(t.name for t in running) == sorted(
                (worker_threads(worker) - first_pool_thread_only)
                | {"flowengine-timelimits", f"flowengine-events-{worker.worker_id}"}
            )
            tt.RELEASE.set()
            assert client.final(cid)["state"] == "SUCCESS"
            # And when it is stopped, none is left
            worker.stop()
            assert [t.name for t in running if t.is_alive()] == []


def test_a_request_that_stops_its_worker_is_answered_and_its_threads_end():
    exchange = unique()
    # Given a worker whose request stops it from its own pool thread
    with Client(exchange, **MEMORY) as client:
        before = set(threading.enumerate())
        worker = tt.WORKER = wk.Worker(
            exchange, "a", [tt.StopsItsWorker], threads_count=POOL, **MEMORY
        )
        with serving(worker) as runner:
            cid = client.request(tt.StopsItsWorker(), routing_key="a")
            # Then the request is answered and the worker's run() returns
            assert client.final(cid)["state"] == "SUCCESS"
            runner.join(WAIT_S)
            assert not runner.is_alive()
        # And every thread it started ends (the last ones once that request
        # was answered, which its stop() could not wait for)
        for thread in started_since(before):
            thread.join(WAIT_S)
        assert [t.name for t in started_since(before)] == []


def test_an_engine_runs_named_threads_and_none_is_left_after_its_run():
    exchange = unique()
    worker = wk.Worker(exchange, "t", [tt.Hold], threads_count=1, **MEMORY)
    with serving(worker):
        # Given an engine running a flow whose task is running on a worker
        engine = engines.load(
            lf.Flow("f").add(tt.Hold("h")),
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            **MEMORY,
        )
        executor_id = engine._task_executor.uuid
        run = threading.Thread(target=engine.run, name="test-engine-run", daemon=True)
        run.start()
        assert tt.wait_started(1)

        def engine_threads() -> list[threading.Thread]:
            return [t for t in threading.enumerate() if t.name.endswith(executor_id)]

        # When its threads are counted
        running = engine_threads()
        # Then each is named after its role, and these are all there are
        assert sorted(t.name for t in running) == sorted(
            f"flowengine-{role}-{executor_id}" for role in ("housekeeping", "replies", "sender")
        )
        # And once its run is over, none is left
        tt.RELEASE.set()
        run.join(WAIT_S)
        assert not run.is_alive()
        assert [t.name for t in running if t.is_alive()] == []
        assert engine_threads() == []
