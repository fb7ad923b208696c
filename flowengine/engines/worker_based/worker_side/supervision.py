"""The performer's hooks of one worker topic: activity, exception handlers, metrics.

One :class:`Supervision` per topic served (its requests are shown with that
topic), sharing the worker's :class:`~.activity.Activity`, its
:class:`~.exception_handlers.HandlerChain` and its metrics; with
OpenTelemetry installed it also traces each request body
(:mod:`flowengine.tracing.worker_spans`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from flowengine import tracing
from flowengine.engines.worker_based.worker_side.activity import Activity
from flowengine.engines.worker_based.worker_side.exception_handlers import (
    FailedRequest,
    HandlerChain,
)
from flowengine.engines.worker_based.worker_side.performer import Job
from flowengine.types import failure as ft

if TYPE_CHECKING:
    from flowengine.tracing.worker_spans import RequestSpans


class RequestMetrics(Protocol):
    """Where a worker counts its requests (see :mod:`flowengine.metrics`)."""

    def received(self, job: Job, topic: str) -> None:
        """A request was taken."""

    def finished(self, job: Job, topic: str, outcome: str, elapsed_s: float) -> None:
        """A request's body ended: ``outcome`` is succeeded, failed or cancelled."""


class Supervision:
    """Implements the performer's RequestHooks for the requests of ``topic``."""

    def __init__(self, activity: Activity, topic: str, worker_id: str,
                 chain: HandlerChain | None = None,
                 metrics: RequestMetrics | None = None) -> None:
        self.activity = activity
        self._topic = topic
        self._worker_id = worker_id
        self._chain = chain or HandlerChain()
        self._metrics = metrics
        self._spans: RequestSpans | None = None
        if tracing.enabled():
            from flowengine.tracing import worker_spans

            self._spans = worker_spans.RequestSpans(worker_id, topic)

    def received(self, job: Job) -> None:
        """Shown as queued by ``inspect reserved``; counted."""
        self.activity.received(job, self._topic)
        if self._metrics is not None:
            self._metrics.received(job, self._topic)

    def refusal(self, job: Job) -> BaseException | None:
        """RequestCancelled when it was cancelled before it started."""
        refusal = self.activity.refusal(job)
        if refusal is not None and self._metrics is not None:
            self._metrics.finished(job, self._topic, "cancelled", 0.0)
        return refusal

    def started(self, job: Job) -> threading.Event:
        """Shown as running (and traced); its cancellation flag."""
        cancelled = self.activity.started(job)
        if self._spans is not None:
            self._spans.started(job)
        return cancelled

    def failed(self, job: Job, failure: ft.Failure, elapsed_s: float) -> None:
        """Run the exception-handler chain."""
        self._chain(FailedRequest.of(job, failure, elapsed_s, self._worker_id))

    def finished(self, job: Job, result: Any, elapsed_s: float) -> None:
        """Count the outcome."""
        if self._spans is not None:
            self._spans.finished(job, result)
        failed = isinstance(result, ft.Failure)
        self.activity.finished(job, failed, elapsed_s)
        if self._metrics is not None:
            outcome = "succeeded"
            if failed:
                outcome = "cancelled" if result.check(_cancelled()) else "failed"
            self._metrics.finished(job, self._topic, outcome, elapsed_s)

    def done(self, job: Job) -> None:
        """No longer held."""
        if self._spans is not None:
            self._spans.done(job)
        self.activity.done(job)


def _cancelled() -> type[BaseException]:
    from flowengine import exceptions as exc

    return exc.RequestCancelled
