"""Engines of one process share one started executor (engine option ``shared=True``).

Given a worker on flowengine's memory transport, engines run with
``shared=True`` use one executor of the process's pool: one reply consumer
however many engines run at once; each engine's requests carry its own
trace ids and land in its own statistics; an engine that stops cancels and
fails only its own unfinished requests; an executor nobody uses closes
after its idle time; a start that fails reaches every engine that waited
for it and is not kept.
"""

from __future__ import annotations

import contextlib
import os
import threading
import types
from concurrent import futures

import pytest

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.executor_side import sharing
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.publisher import RequestPublisher
from flowengine.engines.worker_based.executor_side.remote_stats import RemoteStatistics
from flowengine.patterns import linear_flow as lf
from tests import waiting
from tests.worker_based import executor_tasks as et
from tests.worker_based import thread_tasks
from tests.worker_based.executor_helpers import MEMORY, WAIT_S, running_worker, unique
from tests.worker_based.wire_helpers import as_broker


def _reply_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("flowengine-replies-")]


def _run_shared(flow, exchange, topic, **store):
    engine = engines.load(
        flow, store=store, engine="worker-based", exchange=exchange, topics=[topic],
        shared=True, **MEMORY,
    )  # fmt: skip
    engine.run()
    return engine


def test_engines_run_one_after_another_share_one_started_executor():
    exchange, topic = unique(), unique("t")
    with running_worker(exchange, topic, [et.Echo]):
        results = [
            _run_shared(
                lf.Flow("f").add(et.Echo(provides="out")), exchange, topic, value=i
            ).storage.fetch("out")
            for i in range(3)
        ]
        assert results == [0, 1, 2]
        # Then one executor served them, and stays up for the next run
        assert len(sharing.POOL) == 1
        assert len(_reply_threads()) == 1


def test_engines_running_at_once_cost_one_reply_consumer():
    exchange, topic = unique(), unique("t")
    engines_at_once = 12
    thread_tasks.reset()
    with running_worker(exchange, topic, [thread_tasks.Hold], threads=engines_at_once):
        with futures.ThreadPoolExecutor(engines_at_once) as pool:
            runs = [
                pool.submit(_run_shared, lf.Flow(f"f{i}").add(thread_tasks.Hold()), exchange, topic)
                for i in range(engines_at_once)
            ]
            # When every engine has its task running on the worker
            try:
                assert thread_tasks.wait_started(engines_at_once)
                # Then they share one consumer of replies (and one executor)
                assert len(_reply_threads()) == 1
                assert len(sharing.POOL) == 1
            finally:
                thread_tasks.RELEASE.set()
            for run in runs:
                run.result(WAIT_S)


def test_each_engine_has_its_own_statistics():
    exchange, topic = unique(), unique("t")
    with running_worker(exchange, topic, [et.Echo, et.Other]):
        first = _run_shared(lf.Flow("f").add(et.Echo("echo")), exchange, topic, value=1)
        second = _run_shared(lf.Flow("g").add(et.Other("double")), exchange, topic, value=2)
    assert set(first.statistics["atoms"]) == {"echo"}
    assert set(second.statistics["atoms"]) == {"double"}


def _sessions(pool, exchange, topic, count):
    settings = {
        "exchange": exchange,
        "topics": [topic],
        "broker": as_broker(dict(MEMORY))["broker"],
    }
    key = sharing.pool_key(**settings)
    made: list[wex.WorkerTaskExecutor] = []

    def make():
        made.append(wex.WorkerTaskExecutor(unique("x"), **settings))
        return made[-1]

    return [sharing.EngineSession(pool, key, make) for _ in range(count)], made


def test_an_engine_that_stops_fails_only_its_own_unfinished_requests():
    exchange, topic = unique(), unique("t")
    pool = sharing.ExecutorPool()
    thread_tasks.reset()
    with running_worker(exchange, topic, [thread_tasks.Hold, et.Echo]):
        (held, quick), made = _sessions(pool, exchange, topic, 2)
        held.start()
        quick.start()
        try:
            assert len(made) == 1
            running = held.execute_task(thread_tasks.Hold(), "u-held", {})
            assert thread_tasks.wait_started(1)
            assert quick.execute_task(et.Echo(), "u-quick", {"value": 7}).result(WAIT_S)[1] == 7
            # When the quick engine stops, the other's request goes on
            quick.stop()
            assert not running.done()
            # When the holding engine stops, its request fails, named
            held.stop()
            outcome = running.result(WAIT_S)[1]
            assert outcome.check(exc.ExecutionFailure)
            assert "stopped before request" in outcome.exception_str
        finally:
            thread_tasks.RELEASE.set()
            pool.close()


def test_an_unused_shared_executor_closes_after_its_idle_time():
    exchange, topic = unique(), unique("t")
    pool = sharing.ExecutorPool(idle_close_s=0.2)
    # pool.close() whatever happens: an executor left running would be
    # counted by the next test of this process.
    with running_worker(exchange, topic, [et.Echo]), contextlib.closing(pool):
        (session,), made = _sessions(pool, exchange, topic, 1)
        session.start()
        result = session.execute_task(et.Echo(), "u-1", {"value": 1})
        done, _ = futures.wait([result], WAIT_S)
        assert done, (
            f"no outcome in {WAIT_S} s (workers the executor still missed:"
            f" {made[0].wait_for_workers(1, 0)})\n" + waiting.thread_stacks()
        )
        assert result.result()[1] == 1
        session.stop()
        uuid = made[0].uuid
        # Then its threads end once it was idle that long, and the pool forgets it
        waiting.wait_until(
            lambda: not any(t.name.endswith(uuid) for t in threading.enumerate()),
            "the idle executor's threads to end",
            WAIT_S,
        )
        assert len(pool) == 0
        # And the next engine starts a new one
        session.start()
        try:
            assert len(made) == 2
        finally:
            session.stop()


class _Unreachable(wex.WorkerTaskExecutor):
    """An executor whose start fails as a wrong broker login does."""

    def start(self) -> None:
        raise exc.BrokerConfigError("login refused")


def test_a_failed_start_reaches_every_waiting_engine_and_is_not_kept():
    pool = sharing.ExecutorPool()
    made: list[wex.WorkerTaskExecutor] = []

    def make():
        made.append(_Unreachable(unique("x"), unique(), [], **as_broker(dict(MEMORY))))
        return made[-1]

    sessions = [sharing.EngineSession(pool, "k", make) for _ in range(2)]
    for session in sessions:
        with pytest.raises(exc.BrokerConfigError, match="login refused"):
            session.start()
    # Then nothing is kept: each engine tried a fresh executor
    assert len(pool) == 0
    assert len(made) == 2


def test_each_request_carries_its_own_engines_trace_ids():
    proxy = types.SimpleNamespace(batches_publications=False)
    publisher = RequestPublisher(proxy, None, "reply", None, on_new_deadline=lambda: None)
    owners = [tr.Owner(RemoteStatistics(), f"flow-{n}", f"detail-{n}") for n in (1, 2)]
    for owner in owners:
        request = pr.Request(et.Echo(), "u", pr.EXECUTE, {"value": 1}, timeout=None)
        headers = publisher.headers_for(tr.Tracked(request, None, None, owner))
        assert (headers[pr.HEADER_ROOT_ID], headers[pr.HEADER_PARENT_ID]) == (
            owner.root_id,
            owner.parent_id,
        )


def test_a_conductors_job_engines_share_one_executor():
    from flowengine.conductors import backends as conductors
    from flowengine.jobs import backends as boards
    from flowengine.persistence.backends import impl_memory
    from flowengine.utils import persistence_utils as pu

    exchange, topic = unique(), unique("t")
    persistence = impl_memory.MemoryBackend()
    board = boards.fetch("jobs", {"board": "memory://"}, persistence=persistence)
    board.connect()
    options = {"exchange": exchange, "topics": [topic], "shared": True, **MEMORY}
    conductor = conductors.fetch(
        "nonblocking",
        "c1",
        board,
        persistence=persistence,
        engine="worker-based",
        engine_options=options,
        wait_timeout=0.1,
    )
    conductor.connect()
    with running_worker(exchange, topic, [et.Echo]):
        runner = threading.Thread(target=conductor.run, daemon=True)
        runner.start()
        try:
            jobs = []
            for n in range(4):
                book, detail = pu.temporary_flow_detail(persistence)
                engines.save_factory_details(detail, _echo_flow, [], {}, backend=persistence)
                jobs.append(
                    board.post(
                        f"j{n}", book, details={"flow_uuid": detail.uuid, "store": {"value": n}}
                    )
                )
            outcomes = [board.wait_for_outcome(job, WAIT_S) for job in jobs]
            assert [o.outcome for o in outcomes] == ["succeeded"] * 4
            # Then one executor served every job, and stays up for the next
            assert len(sharing.POOL) == 1
            assert len(_reply_threads()) == 1
        finally:
            conductor.stop()
            conductor.wait(WAIT_S)
            runner.join(WAIT_S)
            conductor.close()
            board.close()


def _echo_flow():
    return lf.Flow("echo").add(et.Echo())


def test_a_forked_child_starts_with_an_empty_pool():
    exchange, topic = unique(), unique("t")
    with running_worker(exchange, topic, [et.Echo]):
        _run_shared(lf.Flow("f").add(et.Echo()), exchange, topic, value=1)
        assert len(sharing.POOL) == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its copy of the executor has no threads
            os.write(write, str(len(sharing.POOL)).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            in_child = pipe.read()
        os.waitpid(pid, 0)
    assert in_child == "0"
    assert len(sharing.POOL) == 1  # the parent's is untouched
