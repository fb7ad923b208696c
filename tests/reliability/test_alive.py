"""A slow but alive task (long, heartbeating, CPU-bound) is never declared dead.

Given worker processes with a short heartbeat interval, when two tasks keep
both threads of a worker busy in pure Python for many times the loss bound,
then neither is declared lost or dispatched again: each ran once.
"""

from __future__ import annotations

import uuid

import pytest

from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import HEARTBEAT_S, MISSES, Workers

#: How long each task computes (s): three times the loss bound.
BUSY_S = HEARTBEAT_S * MISSES * 3

#: Bounded wait (s) for results, only to fail instead of hanging.
WAIT_S = 60.0


@pytest.mark.slow
def test_long_busy_task_is_never_declared_dead(conn, tmp_path, unique_name):
    records = str(tmp_path / "records.jsonl")
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(conn, unique_name, "alive", records, str(logs), threads=2)
    executor = wex.WorkerTaskExecutor(
        uuid.uuid4().hex,
        unique_name,
        ["alive"],
        policy=RequestPolicy(heartbeat_misses=MISSES),
        **conn.kwargs(),
    )
    try:
        workers.start()
        executor.start()
        assert executor.wait_for_workers(1, WAIT_S) == 0, workers.logs()
        # When two long CPU-bound tasks run side by side on one worker
        futs = [
            executor.execute_task(fault_tasks.Busy(f"busy{i}"), f"u{i}", {"seconds": BUSY_S})
            for i in range(2)
        ]
        results = [f.result(WAIT_S) for f in futs]
    finally:
        executor.stop()
        workers.stop_all()
    # Then both finished, neither was declared lost, each ran once
    assert all(event == base.EXECUTED and spins > 0 for event, spins in results), results
    assert list(executor.lost_history) == []
    report = checker.check(checker.read_records(records), ["busy0", "busy1"])
    assert sorted(report.done_once) == ["busy0", "busy1"], report.summary()
    assert all(run.attempt == 0 for runs in report.executions.values() for run in runs)
