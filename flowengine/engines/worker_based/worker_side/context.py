"""What task code can learn about the request it runs for (worker side).

Inside ``execute``/``revert`` of a task run by a flowengine worker,
:func:`current` returns the request's uuid, action, attempt number and
submission id, so a task can make its side effects idempotent (for example
"insert ... on conflict (request_uuid) do nothing"). Outside a worker it
returns None.

A long task can also notice that it was cancelled (``flowengine control
cancel``): :attr:`RequestContext.cancel_requested` turns True, and
:meth:`RequestContext.raise_if_cancelled` raises RequestCancelled, which
fails the request with that clear cause. A thread cannot be stopped from
outside, so a task that never looks runs to its end (the process executor
kills its child instead).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from flowengine import exceptions as exc


@dataclass(frozen=True)
class RequestContext:
    """The request a task body is running for."""

    #: The request (task) uuid; the same for every attempt, and for the
    #: execute and the revert of one task.
    uuid: str
    #: 'execute' or 'revert'.
    action: str
    #: 0 for the first dispatch, 1 after the first worker was lost, ...
    attempt: int
    #: Id of this engine submission (None from executors that send none).
    request_id: str | None
    #: Id of the worker running it.
    worker_id: str
    #: Set when the request is cancelled while it runs.
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this request."""
        return self.cancelled.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise RequestCancelled when this request was cancelled (a task's check point)."""
        if self.cancelled.is_set():
            raise exc.RequestCancelled(
                f"Request {self.uuid} ({self.action}) was cancelled"
                f" while it ran on worker {self.worker_id}"
            )


_CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "flowengine_request", default=None
)


def current() -> RequestContext | None:
    """The request being run in this thread (None outside a worker's task)."""
    return _CURRENT.get()


@contextlib.contextmanager
def running(ctx: RequestContext) -> Iterator[RequestContext]:
    """Make ``ctx`` the current request for the duration of the block."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
