"""Mixed fleets with TaskFlow 6.5 (``compat='taskflow'``): trace headers are ignored there.

A TaskFlow worker gets the ``traceparent`` header with every request and
runs the flow as if it were not there (TaskFlow reads message properties
and the body, never headers); a flowengine worker serving a TaskFlow engine
gets no trace headers and traces each request as the root of its own trace.
In one process, over the memory transport (tests/interop/harness.py).
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")

from tests.interop import harness  # noqa: E402
from tests.interop import shared_tasks as st  # noqa: E402
from tests.tracing import recording  # noqa: E402

LINEAR_RESULTS = {"x": 4, "y": 5, "z": 50}


@pytest.fixture(autouse=True)
def _fast_taskflow(monkeypatch):
    from taskflow.engines.worker_based import proxy

    monkeypatch.setattr(proxy, "DRAIN_EVENTS_PERIOD", harness.TASKFLOW_DRAIN_PERIOD_S)


def taskflow_options() -> dict:
    return {
        "transport": "memory",
        "transport_options": {"polling_interval": harness.TASKFLOW_MEMORY_POLL_S},
    }


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_a_taskflow_worker_runs_traced_requests_and_ignores_their_headers(tmp_path, monkeypatch):
    from taskflow.engines.worker_based import server

    # Given a TaskFlow 6.5 worker (its request handler spied on for the headers it gets)
    headers_seen: list[dict] = []
    process_request = server.Server._process_request

    def spy(self, request, message):
        headers_seen.append(dict(message.headers or {}))
        return process_request(self, request, message)

    monkeypatch.setattr(server.Server, "_process_request", spy)
    exchange = f"tf-{uuid.uuid4().hex[:8]}"
    with recording.recording() as exporter:
        with harness.thread_worker(
            "taskflow", st.build("taskflow"), exchange, "shared", **taskflow_options()
        ):
            # When a traced flowengine engine (compat='taskflow') runs a flow on it
            outcome = harness.run_flow(
                "flowengine",
                "linear",
                st.build("flowengine"),
                str(tmp_path),
                exchange=exchange,
                topics=["shared"],
                transport="memory",
                compat="taskflow",
            )
    # Then the flow succeeds as it does untraced
    assert outcome["error"] is None
    assert outcome["results"] == LINEAR_RESULTS
    # ... although every request carried the engine's trace context
    spans = recording.by_name(recording.records(exporter.get_finished_spans()))
    assert len(headers_seen) == 2
    for headers, atom in zip(headers_seen, ("Add", "Mul"), strict=True):
        span_id = spans[f"execute {atom}"]["span_id"]
        assert headers["traceparent"].split("-")[2] == span_id
    # ... and the engine's spans are all there (the worker made none)
    assert set(spans) == {"flow linear", "execute Add", "execute Mul"}


def test_a_flowengine_worker_traces_a_taskflow_engines_requests_as_new_traces(tmp_path):
    # Given a traced flowengine worker (compat='taskflow')
    exchange = f"tf-{uuid.uuid4().hex[:8]}"
    with recording.recording() as exporter:
        with harness.thread_worker(
            "flowengine",
            st.build("flowengine"),
            exchange,
            "shared",
            transport="memory",
            compat="taskflow",
        ):
            # When a TaskFlow engine runs a flow on it
            outcome = harness.run_flow(
                "taskflow",
                "linear",
                st.build("taskflow"),
                str(tmp_path),
                exchange=exchange,
                topics=["shared"],
                **taskflow_options(),
            )
    # Then the flow succeeds
    assert outcome["results"] == LINEAR_RESULTS
    # ... and each request is the root span of a trace of its own
    spans = recording.by_name(recording.records(exporter.get_finished_spans()))
    assert set(spans) == {"worker execute Add", "worker execute Mul"}
    assert all(span["parent_id"] is None for span in spans.values())
    assert spans["worker execute Add"]["trace_id"] != spans["worker execute Mul"]["trace_id"]
    assert spans["worker execute Add"]["attributes"]["flowengine.outcome"] == "SUCCESS"
    assert "flowengine.flow.uuid" not in spans["worker execute Add"]["attributes"]
