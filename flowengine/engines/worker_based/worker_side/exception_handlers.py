"""What a worker does with a task's failure: a chain of handlers, as RQ workers have.

Each handler is called with a :class:`FailedRequest` after the FAILURE reply
went to the engine (the engine gets the failure whatever the handlers do).
Handlers run in the order given, then the default one, :func:`log_failure`
(the task's name, its exception and traceback at WARNING). A handler that
returns ``False`` stops the chain (the default one included); ``None`` or
``True`` passes the failure on. A handler that raises is logged and the
chain goes on: a broken handler must not hide the failures after it.

``flowengine worker --exception-handler module:func`` (repeatable) and
``Worker(exception_handlers=[...])`` add handlers.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from flowengine.types import failure as ft

if TYPE_CHECKING:
    from flowengine.engines.worker_based.worker_side.middleware import Job

LOG = logging.getLogger("flowengine.engines.worker_based.worker_side.performer")


@dataclasses.dataclass(frozen=True)
class FailedRequest:
    """A request whose task failed on this worker, as exception handlers see it."""

    #: The task's name and class, the action ('execute'/'revert').
    task_name: str
    task_cls: str
    action: str
    #: The request's uuid and attempt (0: its first dispatch).
    request_uuid: str
    attempt: int
    #: This worker's id.
    worker_id: str
    #: The failure (type names, message, traceback text; ``.exception`` when
    #: the exception object lives in this process: not under the process executor).
    failure: ft.Failure
    #: How long the body ran (s).
    elapsed_s: float

    @classmethod
    def of(cls, job: Job, failure: ft.Failure, elapsed_s: float, worker_id: str) -> FailedRequest:
        """The FailedRequest of a performer's job."""
        work = job.work
        return cls(
            work.task_name,
            work.task_cls,
            work.action,
            job.task_uuid,
            job.headers.attempt or 0,
            worker_id,
            failure,
            elapsed_s,
        )


#: An exception handler: False stops the chain; None or True passes the failure on.
ExceptionHandler = Callable[[FailedRequest], bool | None]


def log_failure(failed: FailedRequest) -> None:
    """The default handler: log the failure at WARNING with the task's name and traceback."""
    LOG.warning(
        "Task %r (%s) %s for request %s failed in %.3f s: %s\n%s",
        failed.task_name,
        failed.task_cls,
        failed.action,
        failed.request_uuid,
        failed.elapsed_s,
        failed.failure.exception_str,
        failed.failure.traceback_str or "",
    )


class HandlerChain:
    """Calls ``handlers`` in order, then :func:`log_failure` unless ``default`` is False."""

    def __init__(self, handlers: Sequence[ExceptionHandler] = (), default: bool = True) -> None:
        self.handlers: list[ExceptionHandler] = list(handlers)
        if default:
            self.handlers.append(log_failure)

    def __call__(self, failed: FailedRequest) -> None:
        for handler in self.handlers:
            try:
                verdict = handler(failed)
            except Exception:
                LOG.exception(
                    "Exception handler %r failed on the failure of task %r"
                    " (request %s); going on with the next one",
                    handler,
                    failed.task_name,
                    failed.request_uuid,
                )
                continue
            if verdict is False:
                return


def load_handler(spec: str) -> ExceptionHandler:
    """The callable ``spec`` names (``'module:function'``; ``module.function`` too).

    Raises ValueError for a malformed name or one that is not callable,
    ImportError when the module cannot be imported or lacks the name.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"exception handler {spec!r}: expected 'module:function'")
    module = importlib.import_module(module_name)
    try:
        handler = getattr(module, attr)
    except AttributeError:
        raise ImportError(
            f"exception handler {spec!r}: module {module_name!r} has no {attr!r}"
        ) from None
    if not callable(handler):
        raise ValueError(f"exception handler {spec!r} is not callable")
    found: ExceptionHandler = handler
    return found
