"""The worker's spans: parents from the trace headers, current while the body runs."""

from __future__ import annotations

import threading
import uuid

import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed (pip install -e .[test])"
)

from opentelemetry import trace  # noqa: E402

from flowengine import engines, task, tracing  # noqa: E402
from flowengine.engines.worker_based import protocol as pr  # noqa: E402
from flowengine.engines.worker_based.wire.headers import Headers  # noqa: E402
from flowengine.engines.worker_based.worker_side import worker as wk  # noqa: E402
from flowengine.engines.worker_based.worker_side.middleware import Job  # noqa: E402
from flowengine.patterns import linear_flow  # noqa: E402
from flowengine.tracing import worker_spans  # noqa: E402
from tests.tracing import recording  # noqa: E402

#: W3C's example trace context (a valid traceparent and its tracestate).
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACESTATE = "congo=t61rcWkgMzE"

#: Key signing every message of the in-process fleet.
SECRET = "tracing-test-signing-key"


class Audit(task.Task):
    """Makes a span of its own while it runs (as instrumented task code would)."""

    def execute(self) -> None:
        with tracing.tracer().start_as_current_span("audit write"):
            pass


def test_spans_a_task_makes_are_children_of_its_worker_span():
    # Given a worker in this process (memory transport, signed messages: the
    # trace headers are not signed and must not upset verification) and a
    # recording provider
    exchange = f"audit-{uuid.uuid4().hex[:8]}"
    with recording.recording() as exporter:
        worker = wk.Worker(exchange, "t", [Audit], transport="memory", secret=SECRET)
        thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
        thread.start()
        try:
            assert worker.wait(30.0)
            # When a flow runs a task that makes its own span
            engines.run(
                linear_flow.Flow("audited").add(Audit("audit")),
                engine="worker-based",
                exchange=exchange,
                topics=["t"],
                transport="memory",
                secret=SECRET,
            )
        finally:
            worker.stop()
            thread.join(30.0)
    spans = recording.by_name(recording.records(exporter.get_finished_spans()))
    # Then the chain is task span -> worker span -> engine atom span -> flow span
    chain = ["audit write", "worker execute Audit", "execute Audit", "flow audited"]
    for child, parent in zip(chain, chain[1:]):
        assert spans[child]["parent_id"] == spans[parent]["span_id"], child
    assert len({s["trace_id"] for s in spans.values()}) == 1


def job_with(headers: dict) -> Job:
    work = pr.WorkUnit("tests.tracing.traced_tasks.Pack", "pack", "execute", {})
    return Job(
        endpoint=None,
        task=None,
        work=work,  # type: ignore[arg-type]
        key=("uuid-1", "execute", "request-1"),
        headers=Headers.parse(headers),
    )


def test_the_parent_comes_from_the_headers_and_is_current_until_done():
    with recording.recording() as exporter:
        spans = worker_spans.RequestSpans("worker-1", "t")
        job = job_with({"traceparent": TRACEPARENT, "tracestate": TRACESTATE, "attempt": 2})
        before = trace.get_current_span()
        spans.started(job)
        during = trace.get_current_span()
        spans.finished(job, "packed")
        spans.done(job)
        spans.done(job)  # the performer calls it twice: the second is a no-op
        after = trace.get_current_span()
    [span] = recording.records(exporter.get_finished_spans())
    assert span["trace_id"] == TRACEPARENT.split("-")[1]
    assert span["parent_id"] == TRACEPARENT.split("-")[2]
    assert during.get_span_context().span_id == int(span["span_id"], 16)
    assert after is before
    assert span["attributes"]["flowengine.request.attempt"] == 2
    assert span["attributes"]["flowengine.worker.id"] == "worker-1"
    assert span["attributes"]["flowengine.outcome"] == "SUCCESS"


@pytest.mark.parametrize(
    "traceparent", ["garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "00-abc", "x" * 300, 42]
)
def test_a_malformed_traceparent_makes_a_root_span(traceparent):
    with recording.recording() as exporter:
        spans = worker_spans.RequestSpans("worker-1", "t")
        job = job_with({"traceparent": traceparent})
        spans.started(job)
        spans.finished(job, "packed")
        spans.done(job)
    [span] = recording.records(exporter.get_finished_spans())
    assert span["parent_id"] is None


@pytest.mark.parametrize(
    "value, read",
    [
        (TRACEPARENT, TRACEPARENT),
        ("", None),
        (None, None),
        (7, None),
        (["a"], None),
        ("x" * 1025, None),
    ],
)
def test_headers_read_the_trace_context_checked(value, read):
    # Strings, not over-long: the propagator checks the format itself
    headers = Headers.parse({"traceparent": value, "tracestate": value})
    assert headers.traceparent == read
    assert headers.tracestate == read


def test_a_cancelled_body_is_recorded_as_cancelled():
    from flowengine import exceptions as exc
    from flowengine.types import failure as ft

    with recording.recording() as exporter:
        spans = worker_spans.RequestSpans("worker-1", "t")
        job = job_with({})
        spans.started(job)
        spans.finished(job, ft.Failure.from_exception(exc.RequestCancelled("stop")))
        spans.done(job)
    [span] = recording.records(exporter.get_finished_spans())
    assert span["attributes"]["flowengine.outcome"] == "CANCELLED"
    assert span["status"] == "ERROR"
    assert span["description"] == "flowengine.exceptions.RequestCancelled: stop"
