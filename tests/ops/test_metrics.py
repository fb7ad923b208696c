"""Prometheus metrics of a worker process (``--metrics-port``) and of an engine."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
import uuid

import pytest

from flowengine import engines
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.patterns import linear_flow
from tests.ops import ops_tasks
from tests.ops.helpers import ROOT, WAIT_S, worker_process

# Out of the fast tier (tests/fast_tier.py): runs Python processes.
pytestmark = pytest.mark.broker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as r:
        return str(r.read().decode())


def test_a_worker_counts_its_requests_on_its_metrics_port(real_broker, exchange):
    # Given a worker serving metrics
    port = _free_port()
    with worker_process(
        real_broker, exchange, "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
    ):
        # When it runs a request that succeeds, one that fails and is sent twice
        executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["ops"], url=real_broker)
        executor.start()
        try:
            assert executor.wait_for_workers(1, WAIT_S) == 0
            assert executor.execute_task(ops_tasks.Quick("q"), uuid.uuid4().hex, {}).result(
                WAIT_S
            ) == (base.EXECUTED, 1)
            assert (
                executor.execute_task(ops_tasks.Fails("f"), uuid.uuid4().hex, {})
                .result(WAIT_S)[1]
                .check(ValueError)
            )
        finally:
            executor.stop()
        text = _scrape(port)
    # Then the counters, the run-time histogram and the gauges say so
    # (labelled by task class, not by the atoms' names q and f)
    quick, fails = 'task="tests.ops.ops_tasks.Quick"', 'task="tests.ops.ops_tasks.Fails"'
    assert f'flowengine_worker_requests_received_total{{{quick},topic="ops"}} 1.0' in text
    assert (
        f'flowengine_worker_requests_finished_total{{outcome="succeeded",{quick},topic="ops"}} 1.0'
    ) in text
    assert (
        f'flowengine_worker_requests_finished_total{{outcome="failed",{fails},topic="ops"}} 1.0'
    ) in text
    assert f'flowengine_worker_request_run_seconds_count{{{quick},topic="ops"}} 1.0' in text
    assert 'flowengine_worker_held_requests{state="running"} 0.0' in text
    assert "flowengine_worker_broker_reconnects_total 0.0" in text


def test_an_engine_counts_task_states_and_remote_run_times(real_broker, exchange):
    from flowengine import metrics

    with worker_process(real_broker, exchange):
        flow = linear_flow.Flow("m").add(ops_tasks.Quick("one"), ops_tasks.Quick("two"))
        engine = engines.load(
            flow, engine="worker-based", url=real_broker, exchange=exchange, topics=["ops"]
        )
        watched = metrics.EngineMetrics()
        watched.watch(engine)
        engine.run()
    sample = watched.registry.get_sample_value
    # Two atoms of one class: one series per class, whatever the atoms are named
    quick = "tests.ops.ops_tasks.Quick"
    assert sample("flowengine_engine_tasks_total", {"task": quick, "state": "SUCCESS"}) == 2
    assert sample("flowengine_engine_remote_run_seconds_count", {"task": quick}) == 2
    assert sample("flowengine_engine_tasks_total", {"task": "one", "state": "SUCCESS"}) is None
    assert sample("flowengine_engine_requests_in_flight") == 0
    assert sample("flowengine_engine_broker_reconnects_total") == 0


def test_metrics_without_their_extra_name_the_install_command():
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "try:\n    import flowengine.metrics\n"
        "except ImportError as e:\n    print(type(e).__name__, e, sep='|')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S, cwd=ROOT
    )
    kind, message = proc.stdout.strip().split("|")
    assert kind == "MissingExtra" and "pip install 'flowengine[metrics]'" in message
