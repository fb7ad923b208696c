"""The dashboard's live state against real workers: honest rates, one moment per snapshot."""

from __future__ import annotations

import time
import uuid

import pytest

from flowengine.dashboard.live import LiveState
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.messaging.control_client import ControlClient
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from tests.ops import ops_tasks
from tests.ops.helpers import WAIT_S, worker_process


def _run_quick(url: str, exchange: str, count: int) -> None:
    executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["ops"], url=url)
    executor.start()
    try:
        assert executor.wait_for_workers(1, WAIT_S) == 0
        for _ in range(count):
            executor.execute_task(ops_tasks.Quick("q"), uuid.uuid4().hex, {}).result(WAIT_S)
    finally:
        executor.stop()


def test_throughput_is_per_second_of_the_time_between_two_rounds(real_broker, exchange):
    # Given a live state asked by hand (no poll loop), and a first round
    broker = BrokerSettings(real_broker)
    live = LiveState(exchange, broker, events=False)
    with worker_process(real_broker, exchange), ControlClient(exchange, broker) as client:
        live._client = client
        live.poll_once()
        started = time.time()
        # When 4 requests finish and a second round comes, however late
        _run_quick(real_broker, exchange, 4)
        live.poll_once()
        outer = time.time() - started
    point = live.snapshot()["history"][-1]
    # Then the rate is those 4 over the time that really passed between the rounds
    assert point["succeeded"] == 4 and point["failed"] == 0
    assert 0 < point["dt"] <= outer + 1.0
    assert point["succeeded_per_s"] == pytest.approx(4 / point["dt"])


def test_an_event_is_published_with_the_worker_figures_that_count_it(real_broker, exchange):
    broker = BrokerSettings(real_broker)
    with worker_process(real_broker, exchange, "--events"):
        live = LiveState(exchange, broker, events=True, poll_period_s=3600)
        live.start()
        try:
            version = live.version
            _run_quick(real_broker, exchange, 1)
            # Watch every snapshot until the task's success event shows
            deadline = time.monotonic() + WAIT_S
            while True:
                assert time.monotonic() < deadline, "the success event never showed"
                version = live.wait_change(version, WAIT_S)
                snapshot = live.snapshot()
                if any(e["type"] == "task-succeeded" for e in snapshot["events"]):
                    break
            # The first snapshot showing it already counts it on the worker
            [worker] = snapshot["workers"]
            assert worker["stats"]["totals"]["succeeded"] == 1
        finally:
            live.stop()
