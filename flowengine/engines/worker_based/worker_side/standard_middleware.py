"""The worker's built-in middleware besides events and activity: metrics, tracing,
exception handlers and fencing (see :mod:`.middleware` for the hook points).

A :class:`~.worker.Worker` puts them in its list in this order, after its
:class:`~.activity.Activity` and before its events
(:class:`~.worker_events.EventsMiddleware`) and your own middleware:
tracing (when OpenTelemetry is on), activity, metrics (``metrics=``),
fencing, exception handlers, events.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from flowengine import exceptions as exc
from flowengine import tracing
from flowengine.engines.worker_based.worker_side.exception_handlers import (
    FailedRequest,
    HandlerChain,
)
from flowengine.engines.worker_based.worker_side.middleware import Job, Middleware
from flowengine.types import failure as ft

if TYPE_CHECKING:
    from flowengine.tracing.worker_spans import RequestSpans


class RequestMetrics(Protocol):
    """Where a worker counts its requests (see :mod:`flowengine.metrics`)."""

    def received(self, job: Job, topic: str) -> None:
        """A request was taken."""

    def finished(self, job: Job, topic: str, outcome: str, elapsed_s: float) -> None:
        """A request's body ended: ``outcome`` is succeeded, failed or cancelled."""


class MetricsMiddleware(Middleware):
    """Counts each request in ``metrics`` (``Worker(metrics=...)``)."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self.metrics = metrics

    def after_receive(self, job: Job) -> None:
        """Counted as received."""
        self.metrics.received(job, job.topic)

    def after_refuse(self, job: Job, error: BaseException) -> None:
        """Counted as cancelled when it was (a cancellation vetoed its start)."""
        if isinstance(error, exc.RequestCancelled):
            self.metrics.finished(job, job.topic, "cancelled", 0.0)

    def after_execute(self, job: Job, result: Any, elapsed_s: float) -> None:
        """Its outcome counted: succeeded, failed or cancelled."""
        outcome = "succeeded"
        if isinstance(result, ft.Failure):
            outcome = "cancelled" if result.check(exc.RequestCancelled) else "failed"
        self.metrics.finished(job, job.topic, outcome, elapsed_s)


class TracingMiddleware(Middleware):
    """A span per request body (see :mod:`flowengine.tracing.worker_spans`)."""

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        self._lock = threading.Lock()
        self._by_topic: dict[str, RequestSpans] = {}

    def _spans(self, topic: str) -> RequestSpans:
        # Three calls per request: a topic's spans, once made, are read
        # without the lock (a dict lookup is atomic) and without the import.
        spans = self._by_topic.get(topic)
        if spans is not None:
            return spans
        from flowengine.tracing import worker_spans

        with self._lock:
            spans = self._by_topic.get(topic)
            if spans is None:
                spans = self._by_topic[topic] = worker_spans.RequestSpans(self._worker_id, topic)
            return spans

    def before_execute(self, job: Job) -> None:
        """Open the body's span (current on this thread while it runs)."""
        self._spans(job.topic).started(job)

    def after_execute(self, job: Job, result: Any, elapsed_s: float) -> None:
        """Record its outcome and close it before the outcome leaves."""
        spans = self._spans(job.topic)
        spans.finished(job, result)
        spans.done(job)

    def after_release(self, job: Job) -> None:
        """Close a span left open (the request ended another way)."""
        self._spans(job.topic).done(job)


def tracing_middleware(worker_id: str) -> list[Middleware]:
    """[TracingMiddleware] when tracing is on (OpenTelemetry installed and enabled), else []."""
    return [TracingMiddleware(worker_id)] if tracing.enabled() else []


class ExceptionHandlersMiddleware(Middleware):
    """Runs the exception-handler chain on each failure, once its FAILURE was sent."""

    def __init__(self, worker_id: str, chain: HandlerChain | None = None) -> None:
        self._worker_id = worker_id
        self.chain = chain or HandlerChain()

    def after_reply(self, job: Job, result: Any, elapsed_s: float) -> None:
        """A failure goes through the chain (by default: logged at WARNING)."""
        if isinstance(result, ft.Failure):
            self.chain(FailedRequest.of(job, result, elapsed_s, self._worker_id))


class FencingMiddleware(Middleware):
    """Gives back, whatever the body did, a request fenced while it ran (see :mod:`.fence`).

    The fence's own thread marks and stops the request; here its result
    becomes a FAILURE RequestFenced, which its engine takes as a give-back.
    """

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id

    def override_result(self, job: Job, result: Any) -> Any:
        """RequestFenced instead of ``result`` when the request was fenced."""
        if job.held is None or not job.held.fenced:
            return result
        work = job.work
        return ft.Failure.from_exception(
            exc.RequestFenced(
                f"Worker {self._worker_id} lost its broker while running request"
                f" {job.task_uuid} ({work.action} of task {work.task_name!r}) and stopped"
                f" it; dispatch it again"
            )
        )
