"""The flowengine error hierarchy (names follow TaskFlow so programs catch them)."""

from __future__ import annotations

import builtins
import os
import sys
import traceback
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

__all__ = [
    "AlreadyExists",
    "AmbiguousDependency",
    "BrokerConfigError",
    "BoardUnavailable",
    "BrokerUnavailable",
    "ClaimLost",
    "CompilationFailure",
    "ConductorFailure",
    "DependencyFailure",
    "DisallowedAccess",
    "Duplicate",
    "Empty",
    "ExecutionFailure",
    "FencedOut",
    "FlowEngineError",
    "IncompatibleVersion",
    "InvalidFormat",
    "InvalidState",
    "InvariantViolation",
    "JobFailure",
    "MessageRefused",
    "MissingDependencies",
    "MissingExtra",
    "MultipleChoices",
    "NotFound",
    "NotImplementedError",
    "RequestTimeout",
    "ResultMismatch",
    "SerializationFailure",
    "StorageFailure",
    "TaskFlowException",
    "TimeoutFailure",
    "UnclaimableJob",
    "UnknownTask",
    "WrappedFailure",
    "raise_with_cause",
]


class TaskFlowException(Exception):
    """Root of every error flowengine raises on purpose (optionally with a cause).

    It keeps TaskFlow's class name so that text naming it (``pformat`` with
    ``show_root_class``, logged tracebacks) reads as TaskFlow's does.
    """

    def __init__(self, message: Any, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self._cause = cause

    @property
    def cause(self) -> BaseException | None:
        """The exception that led to this one (or None)."""
        return self._cause

    def __str__(self) -> str:
        return self.pformat()

    def _get_message(self) -> str:
        # Never route through __str__ here: it calls pformat, which calls us.
        return str(self.args[0]) if self.args else ""

    def pformat(
        self, indent: int = 2, indent_text: str = " ", show_root_class: bool = False
    ) -> str:
        """Format this error and its chain of causes, one indented line each."""
        if indent < 0:
            raise ValueError(
                f"Provided 'indent' must be greater than or equal to zero instead of {indent}"
            )
        parts = []
        if show_root_class:
            parts.append(type(self).__name__ + ": ")
        parts.append(self._get_message())
        depth = indent
        seen: list[BaseException] = []
        nxt = self._cause
        while nxt is not None and not any(nxt is s for s in seen):
            seen.append(nxt)
            parts.append(os.linesep)
            pad = indent_text * depth
            if isinstance(nxt, TaskFlowException):
                parts.append(pad + type(nxt).__name__ + ": " + nxt._get_message())
            else:
                lines = traceback.format_exception_only(type(nxt), nxt)
                parts.append(os.linesep.join(pad + ln.rstrip("\n") for ln in lines))
                # Foreign exceptions may have a 'cause' attribute meaning
                # something else entirely, so the chain stops at them.
                break
            depth += indent
            nxt = nxt.cause
        return "".join(parts)


#: flowengine's own name for the root class (an alias: the same class).
FlowEngineError = TaskFlowException


# Storage, conductor and job errors.


class StorageFailure(FlowEngineError):
    """A persistence backend could not read, save or delete something."""


class ConductorFailure(FlowEngineError):
    """A conductor failed while conducting work."""


class JobFailure(FlowEngineError):
    """A job, or an operation on a job, failed."""


class UnclaimableJob(JobFailure):
    """A job could not be claimed."""


class ClaimLost(JobFailure):
    """A claim was superseded (its lease ran out and the job was claimed again): refused."""


class FencedOut(StorageFailure):
    """A persistence write was refused: a newer claim on its job fenced this writer out."""


# Errors while running.


class ExecutionFailure(FlowEngineError):
    """The engine failed while executing a flow."""


class RequestTimeout(ExecutionFailure):
    """A worker request did not finish within its allotted time."""


class InvalidState(ExecutionFailure):
    """An invalid state transition was attempted while executing."""


# Dependency and compilation errors.


class DependencyFailure(FlowEngineError):
    """Some dependency between atoms or flows could not be satisfied."""


class AmbiguousDependency(DependencyFailure):
    """A symbol has several equally close providers and no way to choose."""


class MissingDependencies(DependencyFailure):
    """An atom (or one of its methods) requires symbols nothing provides."""

    MESSAGE_TPL = (
        "'%(who)s' requires %(requirements)s but no other entity produces said requirements"
    )
    METHOD_TPL = "'%(method)s' method on "

    def __init__(
        self,
        who: Any,
        requirements: Any,
        cause: BaseException | None = None,
        method: str | None = None,
    ) -> None:
        message = self.MESSAGE_TPL % {"who": who, "requirements": requirements}
        if method:
            message = (self.METHOD_TPL % {"method": method}) + message
        super().__init__(message, cause=cause)
        self.who = who
        self.method = method
        self.missing_requirements = requirements


class CompilationFailure(FlowEngineError):
    """A flow could not be compiled into something runnable."""


# Miscellaneous errors.


class IncompatibleVersion(FlowEngineError):
    """Two versions (of an atom, a format...) are incompatible."""


class Duplicate(FlowEngineError):
    """A duplicate entry was found."""


class NotFound(FlowEngineError):
    """An entry does not exist."""


class AlreadyExists(FlowEngineError):
    """An entry already exists."""


class Empty(FlowEngineError):
    """Something is empty when it should not be."""


class TimeoutFailure(FlowEngineError):
    """An operation did not complete within its time limit."""


class InvariantViolation(FlowEngineError):
    """An internal invariant was violated."""


class MultipleChoices(FlowEngineError):
    """A decision cannot be made because several choices are possible."""


class InvalidFormat(FlowEngineError):
    """A message or object is not in the expected format (failed validation)."""


class DisallowedAccess(FlowEngineError):
    """Access is not allowed in the current state."""

    def __init__(
        self, message: Any, cause: BaseException | None = None, state: str | None = None
    ) -> None:
        super().__init__(message, cause=cause)
        self.state = state


class UnknownTask(FlowEngineError):
    """A worker was asked to run a task it was not given."""


class SerializationFailure(FlowEngineError):
    """A result or failure could not be serialised to JSON."""


class ResultMismatch(NotFound):
    """A task returned fewer values (or lacks keys) than it declared it provides."""


class NotImplementedError(builtins.NotImplementedError):  # noqa: A001 (TaskFlow's name)
    """Functionality of the library itself that is not implemented (yet)."""


class WrappedFailure(Exception):
    """Carries several Failure objects when no single exception can be re-raised."""

    def __init__(self, causes: Iterable[Any]) -> None:
        super().__init__()
        flat: list[Any] = []
        for cause in causes:
            # Nested wrapped failures are flattened into one list.
            exc = getattr(cause, "exception", None)
            if isinstance(exc, WrappedFailure):
                flat.extend(exc)
            else:
                flat.append(cause)
        self._causes = flat

    def __iter__(self) -> Iterator[Any]:
        return iter(self._causes)

    def __len__(self) -> int:
        return len(self._causes)

    def __getitem__(self, index: int) -> Any:
        return self._causes[index]

    def check(self, *exc_classes: Any) -> Any:
        """Return the first of exc_classes (types or names) any failure matches, else None."""
        if not exc_classes:
            return None
        for cause in self._causes:
            found = cause.check(*exc_classes)
            if found is not None:
                return found
        return None

    def __str__(self) -> str:
        return "WrappedFailure: [" + ", ".join(str(c) for c in self._causes) + "]"


def raise_with_cause(
    exc_cls: type[FlowEngineError], message: Any, *args: Any, **kwargs: Any
) -> NoReturn:
    """Raise ``exc_cls(message, ...)`` chained to ``cause`` (or the active exception)."""
    if not (isinstance(exc_cls, type) and issubclass(exc_cls, FlowEngineError)):
        raise ValueError("Subclass of flowengine exception is required")
    cause = kwargs.pop("cause", None)
    if cause is None:
        cause = sys.exc_info()[1]
    kwargs["cause"] = cause
    raise exc_cls(message, *args, **kwargs) from cause


# Worker time limits and shutdown (worker-based engine).


class SoftTimeLimitExceeded(TimeoutFailure):
    """Raised inside a task body when its soft time limit passes (it may clean up)."""

    # A default message: a worker may raise the class itself inside a thread.
    def __init__(
        self, message: Any = "soft time limit exceeded", cause: BaseException | None = None
    ) -> None:
        super().__init__(message, cause=cause)


class TimeLimitExceeded(TimeoutFailure):
    """A task body ran past its hard time limit and was stopped (killed or interrupted)."""

    def __init__(
        self, message: Any = "hard time limit exceeded", cause: BaseException | None = None
    ) -> None:
        super().__init__(message, cause=cause)


class TaskProcessDied(ExecutionFailure):
    """The child process running a task body ended without reporting an outcome."""


class WorkerShutdown(ExecutionFailure):
    """A worker gave a request back unfinished because it is shutting down (retry elsewhere)."""


class RequestFenced(WorkerShutdown):
    """A worker cut off from its broker stopped a request and gave it back (run elsewhere)."""


class RequestCancelled(ExecutionFailure):
    """A request was cancelled (``flowengine control cancel``) before or while it ran."""


class RequestLost(ExecutionFailure):
    """A remote request's workers kept falling silent; it was given up after its attempts."""


class RequestExpired(RequestTimeout):
    """A worker dropped a request unrun: its ``expires`` time had passed."""


# Broker connections and message authenticity (worker-based engine).


class RecoverableError(FlowEngineError):
    """Base of errors that may go away by themselves: the same call can succeed later."""


class BrokerUnavailable(RecoverableError, ExecutionFailure):
    """The message broker could not be reached (recoverable: retry once it is back)."""


class BoardUnavailable(RecoverableError, JobFailure):
    """A jobboard's server (Redis, PostgreSQL...) could not be reached (recoverable)."""


class BrokerConfigError(ExecutionFailure):
    """Wrong broker URL, transport or login, or an exchange declared otherwise (not retried)."""


class PublishTimeout(BrokerUnavailable):
    """A message could not be published within its time bound (recoverable)."""


class UnverifiedMessage(InvalidFormat):
    """A message is unsigned or badly signed while signing is required (never retried)."""


class MessageRefused(InvalidFormat):
    """A received message cannot be read as sent: its headers, encoding or size (dead-lettered)."""


class DeliveryNotSettled(FlowEngineError):
    """A worker could not acknowledge a delivered request, or another consumer was given it.

    The worker must not run the request: the broker still holds it (or has
    already handed it to another worker), so it runs once, elsewhere or later.
    """


class MissingExtra(ImportError):
    """An optional part of flowengine was used without the extra that installs it.

    The message names the ``pip install 'flowengine[<extra>]'`` to run.
    """
