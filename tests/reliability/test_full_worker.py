"""A full worker keeps its broker connections alive while it waits for room.

Given a worker whose threads are all busy with tasks longer than three AMQP
heartbeat intervals (2 s here, in its URL) and whose queue holds more
requests than it may take, when the flow runs, then no connection of the
worker is reset (its fault proxy sees none of them close, and the worker
logs no lost connection), and the checker counts every request done once:
0 duplicated, 0 lost, 0 concurrent.

On Redis (no AMQP heartbeats) the same flow must not cost a reconnection either.
A worker serving two topics (``amqp-2-topics``: the flow's and an idle one
of lower priority) shares one room between two consume loops, which must
both keep their connections alive while it is full.
"""

from __future__ import annotations

import uuid

import pytest

from flowengine import engines
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.patterns import unordered_flow as uf
from tests.reliability import checker, fault_tasks
from tests.reliability.proxied import FlowRun, ProxiedWorkers

pytestmark = [pytest.mark.broker, pytest.mark.slow]

#: The worker's AMQP heartbeat (s): short, so the test need not wait long,
#: but not so short that a loaded machine's scheduling alone misses one
#: (RabbitMQ closes a connection silent for about two intervals).
AMQP_HEARTBEAT_S = 2

#: How long each task body works (s): longer than three heartbeat intervals.
TASK_S = 6.5

#: One worker with 2 threads holds at most 4 requests (+1): 5 tasks keep it
#: full (the consume loop waiting for room) while the first two run.
TASKS, THREADS = 5, 2

#: The worker's own heartbeat (s), so its engine's loss bound is three times
#: that: this test is about connections, not loss detection, and the usual
#: 0.2 s (0.6 s bound) is missed on a loaded machine; the worker then fences
#: its request and the engine dispatches it again until attempts run out.
WORKER_HEARTBEAT_S = 1.0

#: Bounded wait (s) for the worker to be known, only to fail instead of hanging.
WORKERS_UP_S = 60.0


@pytest.mark.parametrize("kind", ["amqp", "redis", "amqp-2-topics"])
def test_full_worker_keeps_its_connections(kind, request, tmp_path):
    amqp = kind.startswith("amqp")
    url = request.getfixturevalue("amqp_url" if amqp else "redis_url")
    exchange, topic = f"full-{uuid.uuid4().hex[:8]}", "full"
    records = str(tmp_path / "records.jsonl")
    logs = tmp_path / "logs"
    logs.mkdir()
    query = f"?heartbeat={AMQP_HEARTBEAT_S}" if amqp else ""
    extra = ("--topic", "idle") if kind == "amqp-2-topics" else ()
    executor = wex.WorkerTaskExecutor(
        uuid.uuid4().hex, exchange, [topic], url=url, transition_timeout=60.0
    )
    names = [f"s{i}" for i in range(TASKS)]
    with ProxiedWorkers(
        url,
        exchange,
        topic,
        records,
        str(logs),
        threads=THREADS,
        heartbeat_s=WORKER_HEARTBEAT_S,
        extra_args=extra,
    ) as workers:
        worker = workers.start(url_query=query)
        executor.start()
        try:
            assert executor.wait_for_workers(1, WORKERS_UP_S) == 0, workers.logs()
            for served in (topic, *extra[1:]):
                # The executor knows the worker from its first topic; the
                # other consume loop may still be connecting.
                worker.wait_log(f"serves topic {served!r}")
            # Given the worker's connections, once it is up
            connections, closed = worker.proxy.accepted, worker.proxy.closed
            flow = uf.Flow("full")
            for name in names:
                flow.add(fault_tasks.Step(name, inject={"n": 1, "pause": TASK_S}))
            engine = engines.load(flow, engine="worker-based", executor=executor)
            # When it is kept full for several heartbeat intervals
            FlowRun(engine).start().wait(logs=workers.logs)
            log, after_flow = worker.log(), worker.proxy.accepted
            # Then none of its connections was reset or closed (a reconnection
            # closes the old one first; counting connections opened would
            # race with a consume or control loop still connecting).
            assert worker.proxy.closed == closed, log
            assert "connection" not in log.lower() or "lost" not in log.lower(), log
        finally:
            executor.stop()
    report = checker.check(checker.read_records(records), names)
    assert len(report.done_once) == TASKS, report.summary()
    assert not report.concurrent, report.summary()
    print(
        f"[full worker/{kind}] connections through its proxy: {connections} after"
        f" start-up, {after_flow} once the flow was done; {report.summary()}"
    )
