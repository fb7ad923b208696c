"""CONTROL messages in a fleet shared with TaskFlow: invisible to TaskFlow's workers."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")

from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.control_client import ControlClient
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import control as wc
from tests.interop import harness
from tests.interop import shared_tasks as st
from tests.interop.test_memory import EXPECTED, _fast_taskflow, memory_options  # noqa: F401


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_taskflow_workers_never_answer_nor_suffer_control_requests(tmp_path):
    # Given a TaskFlow worker and a flowengine worker (compat) on one exchange and topic
    exchange, topic = f"interop-{uuid.uuid4().hex[:8]}", "shared"
    with (
        harness.thread_worker(
            "taskflow", st.build("taskflow"), exchange, topic, **memory_options("taskflow", True)
        ),
        harness.thread_worker(
            "flowengine",
            st.build("flowengine"),
            exchange,
            topic,
            **memory_options("flowengine", True),
        ) as ours,
    ):
        broker = BrokerSettings(None, "memory", {}, compat="taskflow")
        # When a ping is broadcast
        with ControlClient(exchange, broker) as client:
            answers = client.ask(wc.PING, timeout_s=1.0)
        # Then only the flowengine worker answered
        assert [a.worker_id for a in answers] == [ours.worker_id]
        # When, ours stopped, a CONTROL message reaches the TaskFlow worker's own queue
        ours.stop()
        sender = px.Proxy(
            "sender", exchange, None, broker=broker, options=px.ProxyOptions(queues=[])
        )
        sender.publish(wc.ControlRequest(wc.PING), topic, reply_to="nobody")
        # Then it rejects it and goes on running flows
        outcome = harness.run_flow(
            "taskflow",
            "linear",
            st.build("taskflow"),
            str(tmp_path),
            exchange=exchange,
            topics=[topic],
            **memory_options("taskflow", True),
        )
    assert outcome["results"] == EXPECTED["linear"]["results"]
