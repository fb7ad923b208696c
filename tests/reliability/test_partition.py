"""A worker cut off from the broker by a partition, its sockets left open, mid-task.

Given two worker processes, each reaching the broker through a fault proxy,
running a flow of tasks longer than the loss bound (0.2 s x 5 = 1 s), when
one worker's link is black-holed for 10 s while it runs tasks (nothing
delivered either way, no socket closed), then:

- the engine detects it (its requests are declared lost) and dispatches
  them again to the other worker, and the flow completes: 0 lost;
- the cut-off worker stops those requests itself before the engine could
  dispatch them again (it could not confirm a heartbeat to the broker):
  0 concurrent executions, 0 duplicated completions;
- once the link heals, the late replies it had sent are fenced by the engine
  (a superseded attempt), and it serves again: with the other worker gone, a
  second flow runs on it.
"""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from flowengine import engines
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.patterns import unordered_flow as uf
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import HEARTBEAT_S, MISSES
from tests.reliability.proxied import FlowRun, ProxiedWorkers

pytestmark = [pytest.mark.broker, pytest.mark.slow]

#: How long the partition lasts (s): the scenario's own duration.
PARTITION_S = 10.0

#: Tasks of the first flow and how long each works (s): longer than the bound.
TASKS, TASK_S = 12, 2.0

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 60.0

#: Poll period (s) while waiting for the partitioned worker to be mid-task.
POLL_S = 0.02


def _running_on(records: str, pid: int) -> bool:
    runs = checker.executions_by_name(checker.read_records(records))
    return any(r.pid == pid and r.end is None for rs in runs.values() for r in rs)


@pytest.mark.parametrize("kind", ["redis", "amqp"])
def test_partitioned_worker_is_fenced_and_serves_again(kind, request, tmp_path, caplog):
    url = request.getfixturevalue("redis_url" if kind == "redis" else "amqp_url")
    exchange, topic = f"part-{uuid.uuid4().hex[:8]}", "part"
    records = str(tmp_path / "records.jsonl")
    logs = tmp_path / "logs"
    logs.mkdir()
    policy = RequestPolicy(transition_timeout=WAIT_S, heartbeat_misses=MISSES)
    executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, [topic], url=url, policy=policy)
    names = [f"w{i}" for i in range(TASKS)]
    later = [f"after{i}" for i in range(3)]
    caplog.set_level(logging.INFO, logger="flowengine.engines.worker_based.executor_side")
    with ProxiedWorkers(
        url, exchange, topic, records, str(logs), heartbeat_s=HEARTBEAT_S
    ) as workers:
        cut, other = workers.start(), workers.start()
        executor.start()
        try:
            assert executor.wait_for_workers(2, WAIT_S) == 0, workers.logs()
            flow = uf.Flow("partition").add(
                *[
                    fault_tasks.Work(name, inject={"n": i, "pause": TASK_S})
                    for i, name in enumerate(names)
                ]
            )
            run = FlowRun(engines.load(flow, engine="worker-based", executor=executor))
            run.start()
            # When one worker's link is black-holed while it runs a task
            deadline = time.monotonic() + WAIT_S
            while not _running_on(records, cut.pid):
                assert time.monotonic() < deadline, workers.logs()
                time.sleep(POLL_S)
            with cut.proxy.partitioned():
                time.sleep(PARTITION_S)  # the fault itself lasts this long
            # Then the flow completes (its requests went to the other worker)
            run.wait(logs=workers.logs)
            lost = [
                r
                for r in executor.lost_history
                if r.worker_id and r.worker_id.split(":")[1] == str(cut.pid)
            ]
            assert lost, ("the partition was not detected", list(executor.lost_history))
            # ...and once healed, the cut-off worker serves again: alone now
            assert workers.terminate(other) == 0
            assert executor.wait_for_workers(1, WAIT_S) == 0, workers.logs()
            second = uf.Flow("after").add(
                *[
                    fault_tasks.Work(name, inject={"n": i, "pause": 0.05})
                    for i, name in enumerate(later)
                ]
            )
            FlowRun(engines.load(second, engine="worker-based", executor=executor)).start().wait(
                logs=workers.logs
            )
        finally:
            executor.stop()
        cut_log = cut.log()
    report = checker.check(checker.read_records(records), names + later)
    # 0 lost, 0 concurrent, each task completed exactly once
    assert not report.lost and not report.concurrent, (
        report.summary(),
        {n: report.executions[n] for n in report.concurrent},
        cut.pid,
        cut_log[-6000:],
    )
    assert len(report.done_once) == TASKS + len(later), report.summary()
    stopped = [n for n in names for r in report.executions[n] if r.pid == cut.pid and r.aborted]
    assert "could not confirm a heartbeat" in cut_log, cut_log
    # The old worker's late replies were fenced (a superseded attempt)
    assert "superseded by attempt" in caplog.text, caplog.text[-3000:]
    assert all(r.pid == cut.pid for n in later for r in report.executions[n])
    fenced = cut_log.count("could not confirm a heartbeat")
    print(
        f"[partition/{kind}] {len(lost)} requests declared lost and re-dispatched (after"
        f" {max(r.silent_s for r in lost):.2f} s of silence at most); {fenced} fenced on the"
        f" cut-off worker, {len(stopped)} of them stopped mid-body; {report.summary()}"
    )
