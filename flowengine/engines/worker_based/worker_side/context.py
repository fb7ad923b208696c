"""What task code can learn about the request it runs for (worker side).

Inside ``execute``/``revert`` of a task run by a flowengine worker,
:func:`current` returns the request's uuid, action, attempt number and
submission id, so a task can make its side effects idempotent (for example
"insert ... on conflict (request_uuid) do nothing"). Outside a worker it
returns None.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass


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


_CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "flowengine_request", default=None)


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
