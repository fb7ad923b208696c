"""The REQUEST message: one task action to run remotely, and its lifecycle.

On the executor a :class:`Request` is also the live record of that action:
its state (moved along :mod:`~flowengine.engines.worker_based.wire.machine`),
its expiry and the future the engine waits on. On the worker a validated
body becomes a :class:`WorkUnit`.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire import clock
from flowengine.engines.worker_based.wire.failures import failure_to_dict, validate_failure
from flowengine.engines.worker_based.wire.machine import START_STATE, TRANSITIONS, make_an_event
from flowengine.engines.worker_based.wire.messages import Message
from flowengine.engines.worker_based.wire.names import (
    ACTION_TO_EVENT,
    NO_RESULT,
    REQUEST,
    REQUEST_TIMEOUT_S,
    STOP_TIMER_STATES,
    WAITING_STATES,
)
from flowengine.engines.worker_based.wire.schemas import (
    REQUEST_SCHEMA,
    REQUEST_VALIDATOR,
    check,
    request_fast,
)
from flowengine.types import failure as ft
from flowengine.utils import reflection

LOG = logging.getLogger(__name__)


class WorkUnit(NamedTuple):
    """A validated request, ready for an endpoint: what to run and with what."""

    task_cls: str
    task_name: str
    action: str
    arguments: dict[str, Any]


class Request(Message):
    """A request to run one task action remotely, and the executor's view of it.

    Every request is created in WAITING with its creation time and timeout; it
    is expired when it stays in WAITING/PENDING longer than the timeout (a
    request in any other state never expires, since nobody can know how long
    the task itself runs).

    Transition table (generated from :func:`build_a_machine`)::

        +------------+------------+---------+----------+---------+
        |   Start    |   Event    |   End   | On Enter | On Exit |
        +------------+------------+---------+----------+---------+
        | FAILURE[$] |     .      |    .    |    .     |    .    |
        |  PENDING   | on_failure | FAILURE |    .     |    .    |
        |  PENDING   | on_running | RUNNING |    .     |    .    |
        |  RUNNING   | on_failure | FAILURE |    .     |    .    |
        |  RUNNING   | on_success | SUCCESS |    .     |    .    |
        | SUCCESS[$] |     .      |    .    |    .     |    .    |
        | WAITING[^] | on_failure | FAILURE |    .     |    .    |
        | WAITING[^] | on_pending | PENDING |    .     |    .    |
        +------------+------------+---------+----------+---------+
    """

    TYPE = REQUEST

    #: Schema of a request body (exactly TaskFlow's).
    SCHEMA = REQUEST_SCHEMA

    def __init__(
        self,
        task: Any,
        uuid: str,
        action: str,
        arguments: dict[str, Any],
        timeout: float | None = REQUEST_TIMEOUT_S,
        result: Any = NO_RESULT,
        failures: dict[str, ft.Failure] | None = None,
    ) -> None:
        if action not in ACTION_TO_EVENT:
            raise ValueError(
                f"Unknown request action {action!r}; expected one of {sorted(ACTION_TO_EVENT)}"
            )
        self._action = action
        self._event = ACTION_TO_EVENT[action]
        self._arguments = arguments
        self._result = result
        self._failures = failures
        self._timeout = timeout
        self._lock = threading.Lock()
        self._state: str = START_STATE
        self._stopped_at: float | None = None
        self.task = task
        self.uuid = uuid
        #: Monotonic time (seconds) the request was created.
        self.created_on = time.monotonic()
        #: Wall-clock time (epoch seconds) the request was created.
        self.created_at = clock.wall()
        #: Resolves to ``(EXECUTED|REVERTED, result or Failure)``.
        self.future: futures.Future[Any] = futures.Future()
        self.future.atom = task  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        name = getattr(self.task, "name", self.task)
        return f"<Request {self.uuid} {self._action} of {name!r} in {self._state}>"

    @property
    def action(self) -> str:
        """The action requested: 'execute' or 'revert'."""
        return self._action

    @property
    def arguments(self) -> dict[str, Any]:
        """Keyword arguments for the remote execute()/revert()."""
        return self._arguments

    @property
    def result(self) -> Any:
        """The result passed to a revert (NO_RESULT when none)."""
        return self._result

    @property
    def failures(self) -> dict[str, ft.Failure] | None:
        """Failures of the flow passed to a revert (or None)."""
        return self._failures

    @property
    def timeout(self) -> float | None:
        """Seconds allowed in WAITING/PENDING (None: no limit)."""
        return self._timeout

    @property
    def current_state(self) -> str:
        """The state the request is in."""
        return self._state

    @property
    def expired(self) -> bool:
        """True when the request stayed in WAITING/PENDING longer than its timeout."""
        if self._state not in WAITING_STATES or self._timeout is None:
            return False
        return time.monotonic() - self.created_on > self._timeout

    @property
    def elapsed(self) -> float:
        """Seconds since creation (until the request left WAITING/PENDING)."""
        end = self._stopped_at if self._stopped_at is not None else time.monotonic()
        return end - self.created_on

    def set_result(self, result: Any) -> bool:
        """Resolve the future with ``(EXECUTED|REVERTED, result)``; False if already done."""
        try:
            self.future.set_result((self._event, result))
        except futures.InvalidStateError:
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable request body (failures become dicts)."""
        version = getattr(self.task, "version", (1, 0))
        body: dict[str, Any] = {
            "task_cls": reflection.get_class_name(self.task),
            "task_name": self.task.name,
            "task_version": list(version) if isinstance(version, tuple) else version,
            "action": self._action,
            "arguments": self._arguments,
        }
        if self._result is not NO_RESULT:
            if isinstance(self._result, ft.Failure):
                body["result"] = ["failure", failure_to_dict(self._result)]
            else:
                body["result"] = ["success", self._result]
        if self._failures:
            body["failures"] = {name: failure_to_dict(f) for name, f in self._failures.items()}
        return body

    def transition(self, new_state: str) -> bool:
        """Move to ``new_state``: True if moved, False if already there; InvalidState if illegal."""
        with self._lock:
            old_state = self._state
            if old_state == new_state:
                return False
            target = TRANSITIONS.get((old_state, make_an_event(new_state)))
            if target is None:
                raise exc.InvalidState(
                    f"Request transition from {old_state} to {new_state} is not allowed"
                )
            self._state = target
            if target in STOP_TIMER_STATES and self._stopped_at is None:
                self._stopped_at = time.monotonic()
        LOG.debug("Transitioned %r from %s state to %s state", self, old_state, new_state)
        return True

    def transition_and_log_error(
        self, new_state: str, logger: logging.Logger | None = None
    ) -> bool:
        """Like transition(), but an illegal move is logged (warning) and returns False."""
        try:
            return self.transition(new_state)
        except exc.InvalidState:
            (logger or LOG).warning(
                "Failed to transition %r to %s state", self, new_state, exc_info=True
            )
            return False

    @classmethod
    def validate(cls, data: Any) -> None:
        """Validate a request body, nested failures included; raise InvalidFormat."""
        check(REQUEST_VALIDATOR, data, "Request message data", request_fast)
        result = data.get("result")
        if result is not None:
            if (
                not isinstance(result, list)
                or len(result) != 2
                or result[0] not in ("success", "failure")
            ):
                raise exc.InvalidFormat(
                    "Request message data not of the expected format:"
                    " 'result' must be ['success', value] or"
                    " ['failure', failure dict] (at $.result)"
                )
            if result[0] == "failure":
                validate_failure(result[1], "Request 'result' failure (at $.result[1])")
        for name, failure in (data.get("failures") or {}).items():
            validate_failure(failure, f"Request failure of {name!r} (at $.failures)")

    @staticmethod
    def from_dict(data: dict[str, Any], task_uuid: str | None = None) -> WorkUnit:
        """Turn **validated** request data into a WorkUnit (failure dicts -> Failure)."""
        arguments: dict[str, Any] = {"arguments": data.get("arguments") or {}}
        if task_uuid is not None:
            arguments["task_uuid"] = task_uuid
        result = data.get("result")
        if result is not None:
            kind, value = result
            arguments["result"] = ft.Failure.from_dict(value) if kind == "failure" else value
        failures = data.get("failures")
        if failures is not None:
            arguments["failures"] = {name: ft.Failure.from_dict(f) for name, f in failures.items()}
        return WorkUnit(data["task_cls"], data["task_name"], data["action"], arguments)
