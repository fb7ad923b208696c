"""A worker's spans: one per request body it runs, a child of the engine's atom span.

Made by the worker's tracing middleware (:mod:`flowengine.engines.
worker_based.worker_side.standard_middleware`), on the pool thread that runs
the body: opened when the body starts, current while it runs (spans the
task makes itself are its children), closed once it ended. The parent
comes from the request's ``traceparent``/``tracestate`` headers; a request
without them (from a TaskFlow engine, or an untraced one) starts a trace of
its own. Requests dropped before they start (cancelled, expired) make no span.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc
from flowengine import tracing
from flowengine.tracing import spans
from flowengine.types import failure as ft
from flowengine.utils import optional

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise optional.missing_extra("otel", e) from e

if TYPE_CHECKING:
    from flowengine.engines.worker_based.worker_side import middleware

#: Outcome of a request whose body was cancelled (RequestCancelled).
CANCELLED = "CANCELLED"


class RequestSpans:
    """The spans of the requests of one worker topic."""

    def __init__(self, worker_id: str, topic: str) -> None:
        self._worker_id = worker_id
        self._topic = topic
        self._lock = threading.Lock()
        # Held request key -> its span and the token that made it current.
        self._open: dict[Any, tuple[Span, Any]] = {}

    def started(self, job: middleware.Job) -> None:
        """``job``'s body starts on this thread: open its span and make it current."""
        headers, work = job.headers, job.work
        carrier = {}
        if headers.traceparent is not None:
            carrier["traceparent"] = headers.traceparent
            if headers.tracestate is not None:
                carrier["tracestate"] = headers.tracestate
        # An empty carrier (or a malformed traceparent) gives an empty
        # context: the span is a root, whatever this thread had current.
        parent = spans.PROPAGATOR.extract(carrier)
        span = tracing.tracer().start_span(
            f"worker {work.action} {spans.short_class(work.task_cls)}",
            context=parent,
            kind=SpanKind.CONSUMER,
        )
        if span.is_recording():
            span.set_attributes(
                {
                    spans.ATOM_NAME: work.task_name,
                    spans.ATOM_UUID: job.task_uuid,
                    spans.TASK_CLASS: work.task_cls,
                    spans.ACTION: work.action,
                    spans.WORKER_ID: self._worker_id,
                    spans.WORKER_TOPIC: self._topic,
                    spans.ATTEMPT: headers.attempt or 0,
                }
            )
            if headers.root_id is not None:
                span.set_attribute(spans.FLOW_UUID, headers.root_id)
        elif not span.get_span_context().is_valid:
            return  # no provider, no trace to carry on: nothing to do (the no-op case)
        token = otel_context.attach(trace.set_span_in_context(span))
        with self._lock:
            self._open[job.key] = (span, token)

    def finished(self, job: middleware.Job, result: Any) -> None:
        """``job``'s body ended with ``result`` (a Failure if it failed): its outcome."""
        with self._lock:
            opened = self._open.get(job.key)
        if opened is None:
            return
        span = opened[0]
        if not isinstance(result, ft.Failure):
            span.set_attribute(spans.OUTCOME, "SUCCESS")
            return
        cancelled = result.check(exc.RequestCancelled)
        span.set_attribute(spans.OUTCOME, CANCELLED if cancelled else "FAILURE")
        spans.record_failure(span, result)

    def done(self, job: middleware.Job) -> None:
        """``job`` is no longer held: close its span (once; called on the body's thread)."""
        with self._lock:
            opened = self._open.pop(job.key, None)
        if opened is None:
            return
        span, token = opened
        otel_context.detach(token)
        span.end()
