"""200 ms added on every hop: slow is not dead.

Given two worker processes and the engine each reaching the broker through a
fault proxy that delays every chunk by 200 ms each way (a request crosses
two hops: 400 ms from engine to worker, and as much back), with a loss bound
sized for that network (heartbeat 2 s, the default, and 10 misses: 20 s;
see the note below), when a flow runs, then it completes with every task done once and
nothing taken for lost: no request dispatched again, no request stopped by
a worker's fence.

Why that bound: on Redis the engine's reply consumer pays two round trips
per reply (take, acknowledge), 0.8 s at this latency, while two workers
send a heartbeat per held request (up to 3 each) every 2 s: heartbeats
queue up behind each other at the engine, and the silence it sees is that
backlog. 12 s (6 misses) was exceeded once (14 s) on a loaded machine; the
bound must cover a round plus the engine's backlog (see
doc/source/reliability.rst, "Latency").
"""

from __future__ import annotations

import logging
import uuid

import pytest

from flowengine import engines
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.patterns import unordered_flow as uf
from tests import faultproxy
from tests.reliability import checker, fault_tasks
from tests.reliability.proxied import FlowRun, ProxiedWorkers

# Redis at this latency is slow to set up and to drain (see the note above).
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(300)]

#: Delay added to every chunk of bytes, each way, on every link (s).
LATENCY_S = 0.2

#: Heartbeat interval (s) and misses allowed: a 20 s loss bound.
HEARTBEAT_S, MISSES = 2.0, 10

#: Tasks and how long each works (s).
TASKS, TASK_S = 4, 1.0

#: Bounded wait (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 90.0


@pytest.mark.parametrize("kind", ["redis", "amqp"])
def test_latency_is_not_taken_for_loss(kind, request, tmp_path, caplog):
    url = request.getfixturevalue("redis_url" if kind == "redis" else "amqp_url")
    exchange, topic = f"lat-{uuid.uuid4().hex[:8]}", "lat"
    records = str(tmp_path / "records.jsonl")
    logs = tmp_path / "logs"
    logs.mkdir()
    names = [f"l{i}" for i in range(TASKS)]
    caplog.set_level(logging.INFO, logger="flowengine.engines.worker_based.executor_side")
    with (
        faultproxy.running(faultproxy.port_of(url)) as engine_link,
        ProxiedWorkers(
            url, exchange, topic, records, str(logs), threads=1, heartbeat_s=HEARTBEAT_S
        ) as workers,
    ):
        # Given every link delayed by 200 ms each way
        engine_link.set_latency(LATENCY_S)
        for _ in range(2):
            workers.start().proxy.set_latency(LATENCY_S)
        executor = wex.WorkerTaskExecutor(
            uuid.uuid4().hex,
            exchange,
            [topic],
            url=engine_link.url(url),
            policy=RequestPolicy(transition_timeout=WAIT_S, heartbeat_misses=MISSES),
        )
        executor.start()
        try:
            assert executor.wait_for_workers(2, WAIT_S) == 0, workers.logs()
            flow = uf.Flow("latency").add(
                *[
                    fault_tasks.Work(name, inject={"n": i, "pause": TASK_S})
                    for i, name in enumerate(names)
                ]
            )
            # When the flow runs
            FlowRun(engines.load(flow, engine="worker-based", executor=executor)).start().wait(
                WAIT_S, logs=workers.logs
            )
        finally:
            executor.stop()
        worker_logs = workers.logs()
    # Then nothing was taken for lost, by the engine or by a worker
    assert list(executor.lost_history) == [], caplog.text[-3000:]
    assert "dispatching it again" not in caplog.text, caplog.text[-3000:]
    assert "could not confirm a heartbeat" not in worker_logs, worker_logs
    report = checker.check(checker.read_records(records), names)
    assert len(report.done_once) == TASKS and not report.concurrent, report.summary()
    print(f"[latency/{kind}] {report.summary()}")
