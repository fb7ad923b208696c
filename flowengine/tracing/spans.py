"""What engine and worker spans share: attribute names, the propagator, failures.

Imports opentelemetry: only imported once :func:`flowengine.tracing.enabled`
said it is there. Attributes never hold a task's arguments or results (they
may hold secrets); a failure is recorded by its exception type, message and
traceback, as the engine's logs and stored failures already show them.
"""

from __future__ import annotations

from flowengine.types import failure as ft
from flowengine.utils import optional

try:
    from opentelemetry.trace import Span, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise optional.missing_extra("otel", e) from e

# Attribute names (the ``flowengine.`` namespace; see doc/source/operations.rst).
FLOW_NAME = "flowengine.flow.name"
FLOW_UUID = "flowengine.flow.uuid"
ENGINE = "flowengine.engine"
ATOM_NAME = "flowengine.atom.name"
ATOM_UUID = "flowengine.atom.uuid"
ATOM_EXECUTION = "flowengine.atom.execution"
TASK_CLASS = "flowengine.task.class"
ACTION = "flowengine.action"
OUTCOME = "flowengine.outcome"
WORKER_ID = "flowengine.worker.id"
WORKER_TOPIC = "flowengine.worker.topic"
ATTEMPT = "flowengine.request.attempt"
DISPATCHES = "flowengine.request.dispatches"

#: The one format both ends speak (not the global propagator, which each
#: host may configure differently): W3C Trace Context, the ``traceparent``
#: and ``tracestate`` headers.
PROPAGATOR = TraceContextTextMapPropagator()

#: Longest status description kept: a huge exception message must not make
#: every exported span huge (the event keeps the whole message).
MAX_DESCRIPTION_CHARS = 200


def short_class(dotted: str) -> str:
    """``myapp.tasks.Charge`` -> ``Charge`` (span names stay short and low-cardinality)."""
    return dotted.rpartition(".")[2]


def record_failure(span: Span, failure: ft.Failure) -> None:
    """Mark ``span`` failed (status ERROR) with an ``exception`` event for ``failure``.

    Written by hand rather than Span.record_exception: a failure that came
    back from a worker has no exception object, only its names and texts.
    """
    kind = failure.exc_type_names[0] if failure.exc_type_names else "Exception"
    message = failure.exception_str
    description = f"{kind}: {message}"
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS] + "..."
    span.set_status(Status(StatusCode.ERROR, description))
    span.add_event(
        "exception",
        {
            "exception.type": kind,
            "exception.message": message,
            "exception.stacktrace": failure.traceback_str or "",
        },
    )
