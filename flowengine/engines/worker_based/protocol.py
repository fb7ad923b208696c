"""The wire protocol between executors and workers: states, messages, schemas.

Every message body is JSON and is validated on receipt with a jsonschema
validator compiled once at import; nested parts (failure dicts inside
responses and revert requests) are validated too, before anything acts on
them. flowengine's additions travel as optional message headers (the names
are the ``HEADER_*`` constants below), never as new required body fields, so
a TaskFlow peer's messages stay valid.
"""

from __future__ import annotations

import abc
import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from concurrent import futures
from typing import Any, NamedTuple

import jsonschema
from automaton import machines

from flowengine import exceptions as exc
from flowengine.types import failure as ft
from flowengine.utils import reflection

LOG = logging.getLogger(__name__)

# Request states (protocol states, not task states) and the EVENT pseudo-state
# a worker uses to forward task notifications (progress) to the executor.
WAITING = "WAITING"
PENDING = "PENDING"
RUNNING = "RUNNING"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
EVENT = "EVENT"

#: States in which a request can still expire (nobody has started it yet).
WAITING_STATES = (WAITING, PENDING)

#: Once one of these is entered the expiry no longer applies.
STOP_TIMER_STATES = (RUNNING, SUCCESS, FAILURE)

# Remote task actions.
EXECUTE = "execute"
REVERT = "revert"

# Outcome tags the request future resolves with; the same values as
# flowengine.engines.action_engine.executor.EXECUTED/REVERTED (kept literal
# here so the protocol does not import the local engine).
EXECUTED = "executed"
REVERTED = "reverted"

#: Remote task action -> outcome tag of the request's future.
ACTION_TO_EVENT = {EXECUTE: EXECUTED, REVERT: REVERTED}

# Message types (the AMQP 'type' property of every message).
NOTIFY = "NOTIFY"
REQUEST = "REQUEST"
RESPONSE = "RESPONSE"

#: Seconds a request may stay in WAITING/PENDING before it fails with
#: RequestTimeout; TaskFlow's default, so TaskFlow programs behave the same.
REQUEST_TIMEOUT_S = 60
REQUEST_TIMEOUT = REQUEST_TIMEOUT_S  # TaskFlow's name

#: Seconds between discovery refreshes (NOTIFY to topics / worker re-announce);
#: TaskFlow's period. Discovery of a *new* worker never waits on it: workers
#: announce themselves when they start.
NOTIFY_PERIOD_S = 5.0
NOTIFY_PERIOD = NOTIFY_PERIOD_S  # TaskFlow's name

#: Seconds of silence after which a worker is forgotten (TaskFlow's default).
EXPIRES_AFTER_S = 60.0
EXPIRES_AFTER = EXPIRES_AFTER_S  # TaskFlow's name

#: Largest message body (bytes) a worker accepts: anything larger is rejected
#: unread, so one oversized message cannot exhaust a worker's memory or time.
MAX_BODY_BYTES = 8 * 1024 * 1024

#: Routing key every executor's reply queue is also bound to; workers publish
#: their announcements (start, periodic refresh, leaving) there.
ANNOUNCE_ROUTING_KEY = "flowengine.announce"

# Header names (flowengine extras; all optional on receipt).
HEADER_EXPIRES = "expires"  # absolute deadline: epoch seconds or ISO 8601
HEADER_ATTEMPT = "attempt"  # how many times this request was dispatched before
HEADER_ROOT_ID = "root_id"  # flow uuid the request belongs to (tracing)
HEADER_PARENT_ID = "parent_id"  # flow detail / parent uuid (tracing)
HEADER_ORIGIN = "origin"  # "hostname:pid" of the sender
HEADER_TIMELIMIT = "timelimit"  # [soft, hard] seconds, or null
HEADER_WORKER_ID = "worker_id"  # unique id of the worker process that sent it
HEADER_LEAVING = "leaving"  # True on a worker's goodbye announcement
HEADER_NAMES = (HEADER_EXPIRES, HEADER_ATTEMPT, HEADER_ROOT_ID, HEADER_PARENT_ID,
                HEADER_ORIGIN, HEADER_TIMELIMIT, HEADER_WORKER_ID, HEADER_LEAVING)

#: Marker meaning "no result given" (None is a valid result).
NO_RESULT = object()


# --- names of queues and routing keys (see the contract's wire details) ---

def topic_queue_name(exchange: str, topic: str) -> str:
    """Queue shared by all workers of a topic (competing consumers)."""
    return f"{exchange}_{topic}"


def worker_routing_key(topic: str, worker_id: str) -> str:
    """Routing key reaching exactly one worker of a topic."""
    return f"{topic}.{worker_id}"


def worker_queue_name(exchange: str, topic: str, worker_id: str) -> str:
    """Private queue of one worker (auto-deleted with it)."""
    return f"{exchange}_{topic}.{worker_id}"


def reply_queue_name(exchange: str, executor_uuid: str) -> str:
    """Reply queue of an executor (its routing key is the executor uuid)."""
    return f"{exchange}_{executor_uuid}"


def make_origin() -> str:
    """The ``origin`` header value of this process: ``hostname:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def make_worker_id() -> str:
    """A worker id unique per worker object: ``hostname:pid:8 hex chars``."""
    return f"{make_origin()}:{uuidlib.uuid4().hex[:8]}"


def parse_expires(value: Any) -> float | None:
    """Turn an ``expires`` header (epoch seconds or ISO 8601) into epoch seconds.

    Returns None when absent; raises InvalidFormat when it cannot be read.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise exc.InvalidFormat(f"Header '{HEADER_EXPIRES}' must be a time, not {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise exc.InvalidFormat(f"Header '{HEADER_EXPIRES}' is not epoch seconds"
                                    f" nor ISO 8601: {value!r}")
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return when.timestamp()
    raise exc.InvalidFormat(f"Header '{HEADER_EXPIRES}' must be a number or a string,"
                            f" not {type(value).__name__}")


# --- the request state machine ---

def make_an_event(new_state: str) -> str:
    """Turn a new/target state into the name of the event that reaches it."""
    return f"on_{new_state}".lower()


def build_a_machine(freeze: bool = True) -> machines.FiniteMachine:
    """Build the state machine every request goes through."""
    m = machines.FiniteMachine()
    for state in (WAITING, PENDING, RUNNING):
        m.add_state(state)
    for state in (SUCCESS, FAILURE):
        m.add_state(state, terminal=True)
    # Created by the executor, not yet acknowledged by any worker.
    m.default_start_state = WAITING
    m.add_transition(WAITING, PENDING, make_an_event(PENDING))
    # Expired before any worker took it (or publishing it failed).
    m.add_transition(WAITING, FAILURE, make_an_event(FAILURE))
    # A worker started running it.
    m.add_transition(PENDING, RUNNING, make_an_event(RUNNING))
    # Expired while pending, or the worker could not even start it.
    m.add_transition(PENDING, FAILURE, make_an_event(FAILURE))
    # The task raised (or the reply could not be encoded).
    m.add_transition(RUNNING, FAILURE, make_an_event(FAILURE))
    m.add_transition(RUNNING, SUCCESS, make_an_event(SUCCESS))
    if freeze:
        m.freeze()
    return m


# Built once: requests move through a (state, event) -> state table read off
# the frozen machine instead of building a machine per request.
_MACHINE = build_a_machine()
_TRANSITIONS: dict[tuple[str, str], str] = {(s, e): t for s, e, t in _MACHINE}


def failure_to_dict(failure: ft.Failure) -> dict[str, Any]:
    """Convert a failure into a JSON-serialisable dict (dropping args that are not)."""
    data = failure.to_dict()
    try:
        _json_check(data)
    except (TypeError, ValueError):
        return failure.to_dict(include_args=False)
    return data


def _json_check(value: Any) -> None:
    """Raise TypeError/ValueError if ``value`` cannot be encoded as JSON."""
    json.dumps(value, allow_nan=False)


# --- validation helpers ---

def _compile(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """Compile a schema once (Draft 4, the dialect TaskFlow's schemas use)."""
    cls = jsonschema.Draft4Validator
    cls.check_schema(schema)
    return cls(schema)


def _check(validator: jsonschema.protocols.Validator, data: Any, what: str,
           fast: Callable[[Any], bool] | None = None) -> None:
    """Validate ``data``; raise InvalidFormat naming the first problem and where.

    ``fast(data)`` may say True only for data the schema accepts (a plain
    structural check of the common shapes): jsonschema then is skipped, since
    it costs ~0.1-0.5 ms per message, several per task. Anything else, valid
    or not, goes through the validator.
    """
    if fast is not None and fast(data):
        return
    if validator.is_valid(data):
        return
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    where = error.json_path if error is not None else "$"
    reason = error.message if error is not None else "invalid"
    if len(reason) > 300:  # a huge offending value must not flood the logs
        reason = reason[:300] + "..."
    # No cause attached: a jsonschema error renders the whole schema, which
    # would flood logs and FAILURE replies; the message says what and where.
    raise exc.InvalidFormat(f"{what} not of the expected format: {reason} (at {where})")


def _validate_failure(data: Any, where: str) -> None:
    """Validate one nested failure dict (fields, causes, version); say where it was."""
    try:
        ft.Failure.validate(data)
    except exc.InvalidFormat as e:
        raise exc.InvalidFormat(f"{where}: {e.args[0] if e.args else e}")
    # The schema leaves 'version' optional, but from_dict only reads the
    # version it knows: check it here, before anything acts on the message.
    pending = [data]
    while pending:
        item = pending.pop()
        version = item.get("version")
        if version != ft.Failure.DICT_VERSION:
            raise exc.InvalidFormat(f"{where}: failure dict version {version!r} is not"
                                    f" supported (expected {ft.Failure.DICT_VERSION})")
        pending.extend(item.get("causes") or ())


class Message(abc.ABC):
    """Base class of all message types."""

    TYPE: str = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object at 0x{id(self):x} with contents {self.to_dict()}>"

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable representation of the message."""


class Notify(Message):
    """A notify message: an executor asking (or a worker telling) who runs what."""

    TYPE = NOTIFY

    #: Schema of a notify *response* (the worker's {topic, tasks}).
    RESPONSE_SCHEMA = {
        "type": "object",
        "properties": {
            "topic": {"type": "string"},
            "tasks": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["topic", "tasks"],
        "additionalProperties": False,
    }

    #: Schema of a notify request from its *sender* (an empty object).
    SENDER_SCHEMA = {
        "type": "object",
        "additionalProperties": False,
    }

    def __init__(self, **data: Any) -> None:
        self._data = data

    @property
    def topic(self) -> str | None:
        """Topic the answering worker serves (responses only)."""
        return self._data.get("topic")

    @property
    def tasks(self) -> list[str] | None:
        """Task class names the answering worker can run (responses only)."""
        return self._data.get("tasks")

    def to_dict(self) -> dict[str, Any]:
        """Return the body to publish."""
        return self._data

    @classmethod
    def validate(cls, data: Any, response: bool) -> None:
        """Validate a notify body (``response`` selects which schema); raise InvalidFormat."""
        if response:
            _check(_NOTIFY_RESPONSE_VALIDATOR, data, "Notify message response data")
        else:
            _check(_NOTIFY_SENDER_VALIDATOR, data, "Notify message sender data")


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
    SCHEMA = {
        "type": "object",
        "properties": {
            # Only sent on revert (hence not required).
            "result": {},
            "failures": {"type": "object"},
            "task_cls": {"type": "string"},
            "task_name": {"type": "string"},
            "task_version": {"oneOf": [{"type": "string"}, {"type": "array"}]},
            "action": {"type": "string", "enum": [EXECUTE, REVERT]},
            # Keyword arguments of the remote execute()/revert().
            "arguments": {"type": "object"},
        },
        "required": ["task_cls", "task_name", "task_version", "action"],
    }

    def __init__(self, task: Any, uuid: str, action: str, arguments: dict[str, Any],
                 timeout: float | None = REQUEST_TIMEOUT_S, result: Any = NO_RESULT,
                 failures: dict[str, ft.Failure] | None = None) -> None:
        if action not in ACTION_TO_EVENT:
            raise ValueError(f"Unknown request action {action!r};"
                             f" expected one of {sorted(ACTION_TO_EVENT)}")
        self._action = action
        self._event = ACTION_TO_EVENT[action]
        self._arguments = arguments
        self._result = result
        self._failures = failures
        self._timeout = timeout
        self._lock = threading.Lock()
        self._state = _MACHINE.default_start_state
        self._stopped_at: float | None = None
        self.task = task
        self.uuid = uuid
        #: Monotonic time (seconds) the request was created.
        self.created_on = time.monotonic()
        #: Wall-clock time (epoch seconds) the request was created.
        self.created_at = time.time()
        #: Resolves to ``(EXECUTED|REVERTED, result or Failure)``.
        self.future: futures.Future = futures.Future()
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
            target = _TRANSITIONS.get((old_state, make_an_event(new_state)))
            if target is None:
                raise exc.InvalidState(f"Request transition from {old_state} to {new_state}"
                                       f" is not allowed")
            self._state = target
            if target in STOP_TIMER_STATES and self._stopped_at is None:
                self._stopped_at = time.monotonic()
        LOG.debug("Transitioned %r from %s state to %s state", self, old_state, new_state)
        return True

    def transition_and_log_error(self, new_state: str, logger: logging.Logger | None = None
                                 ) -> bool:
        """Like transition(), but an illegal move is logged (warning) and returns False."""
        try:
            return self.transition(new_state)
        except exc.InvalidState:
            (logger or LOG).warning("Failed to transition %r to %s state", self, new_state,
                                    exc_info=True)
            return False

    @classmethod
    def validate(cls, data: Any) -> None:
        """Validate a request body, nested failures included; raise InvalidFormat."""
        _check(_REQUEST_VALIDATOR, data, "Request message data", _request_fast)
        result = data.get("result")
        if result is not None:
            if (not isinstance(result, list) or len(result) != 2
                    or result[0] not in ("success", "failure")):
                raise exc.InvalidFormat("Request message data not of the expected format:"
                                        " 'result' must be ['success', value] or"
                                        " ['failure', failure dict] (at $.result)")
            if result[0] == "failure":
                _validate_failure(result[1], "Request 'result' failure (at $.result[1])")
        for name, failure in (data.get("failures") or {}).items():
            _validate_failure(failure, f"Request failure of {name!r} (at $.failures)")

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
            arguments["failures"] = {name: ft.Failure.from_dict(f)
                                     for name, f in failures.items()}
        return WorkUnit(data["task_cls"], data["task_name"], data["action"], arguments)


class Response(Message):
    """A worker's reply about a request: a state change, an event or the outcome."""

    TYPE = RESPONSE

    #: Schema of a response body (exactly TaskFlow's).
    SCHEMA = {
        "type": "object",
        "properties": {
            "state": {"type": "string",
                      "enum": [WAITING, PENDING, RUNNING, SUCCESS, FAILURE, EVENT]},
            "data": {
                "anyOf": [
                    {"$ref": "#/definitions/event"},
                    {"$ref": "#/definitions/completion"},
                    {"$ref": "#/definitions/empty"},
                ],
            },
        },
        "required": ["state", "data"],
        "additionalProperties": False,
        "definitions": {
            "event": {
                "type": "object",
                "properties": {
                    "event_type": {"type": "string"},
                    "details": {"type": "object"},
                },
                "required": ["event_type", "details"],
                "additionalProperties": False,
            },
            # Only a state change, no data.
            "empty": {"type": "object", "additionalProperties": False},
            "completion": {
                "type": "object",
                # Any JSON value a task returns.
                "properties": {"result": {}},
                "required": ["result"],
                "additionalProperties": False,
            },
        },
    }

    def __init__(self, state: str, **data: Any) -> None:
        self.state = state
        self.data = data

    @staticmethod
    def normalize(data: Any) -> Any:
        """Return ``data`` with a flat legacy EVENT body nested under 'data'.

        TaskFlow's documentation shows progress events as
        ``{"state": "EVENT", "event_type": ..., "details": ...}``; the schema
        (and TaskFlow's workers) put those two under ``data``. Both are accepted.
        """
        if (isinstance(data, dict) and data.get("state") == EVENT and "data" not in data
                and "event_type" in data):
            rest = {k: v for k, v in data.items() if k != "state"}
            return {"state": EVENT, "data": rest}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Response:
        """Build a Response from **validated** data (a FAILURE result -> Failure)."""
        data = cls.normalize(data)
        state = data["state"]
        payload = dict(data["data"])
        if state == FAILURE and "result" in payload:
            payload["result"] = ft.Failure.from_dict(payload["result"])
        return cls(state, **payload)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable body (a Failure result becomes a dict)."""
        data = self.data
        result = data.get("result")
        if isinstance(result, ft.Failure):
            data = dict(data, result=failure_to_dict(result))
        return {"state": self.state, "data": data}

    @classmethod
    def validate(cls, data: Any) -> None:
        """Validate a response body, its shape per state and nested failure; raise InvalidFormat."""
        data = cls.normalize(data)
        _check(_RESPONSE_VALIDATOR, data, "Response message data", _response_fast)
        state, payload = data["state"], data["data"]
        if state in (SUCCESS, FAILURE) and "result" not in payload:
            raise exc.InvalidFormat(f"Response message data not of the expected format:"
                                    f" a {state} response needs data.result (at $.data)")
        if state == EVENT and "event_type" not in payload:
            raise exc.InvalidFormat("Response message data not of the expected format:"
                                    " an EVENT response needs data.event_type and"
                                    " data.details (at $.data)")
        if state == FAILURE:
            _validate_failure(payload["result"], "Response failure (at $.data.result)")


# --- fast paths: sufficient (never necessary) conditions for validity --------
# Each returns True only for data its schema accepts; tests check them against
# the jsonschema validators on generated bodies.

_RESPONSE_STATES = frozenset((WAITING, PENDING, RUNNING, SUCCESS, FAILURE, EVENT))
_COMPLETION_KEYS = frozenset(("result",))
_EVENT_KEYS = frozenset(("event_type", "details"))
_REQUEST_ACTIONS = frozenset((EXECUTE, REVERT))


def _response_fast(data: Any) -> bool:
    """Response.SCHEMA holds for ``data`` (checked by hand for the usual shapes)."""
    if not isinstance(data, dict) or len(data) != 2:
        return False
    state, payload = data.get("state"), data.get("data")
    if not isinstance(state, str) or state not in _RESPONSE_STATES:
        return False
    if not isinstance(payload, dict):
        return False
    keys = payload.keys()
    if not payload or keys == _COMPLETION_KEYS:
        return True
    return (keys == _EVENT_KEYS and isinstance(payload["event_type"], str)
            and isinstance(payload["details"], dict))


def _request_fast(data: Any) -> bool:
    """Request.SCHEMA holds for ``data`` (checked by hand)."""
    if not isinstance(data, dict):
        return False
    action = data.get("action")
    version = data.get("task_version")
    return (isinstance(data.get("task_cls"), str) and isinstance(data.get("task_name"), str)
            and isinstance(version, (str, list))
            and isinstance(action, str) and action in _REQUEST_ACTIONS
            and isinstance(data.get("arguments", {}), dict)
            and isinstance(data.get("failures", {}), dict))


# Compiled once at import (TaskFlow rebuilt them on every message).
_NOTIFY_RESPONSE_VALIDATOR = _compile(Notify.RESPONSE_SCHEMA)
_NOTIFY_SENDER_VALIDATOR = _compile(Notify.SENDER_SCHEMA)
_REQUEST_VALIDATOR = _compile(Request.SCHEMA)
_RESPONSE_VALIDATOR = _compile(Response.SCHEMA)

# TaskFlow exposes the work unit under this private-looking name; keep an alias.
_WorkUnit = WorkUnit

__all__ = [
    "ACTION_TO_EVENT", "ANNOUNCE_ROUTING_KEY", "EVENT", "EXECUTE", "EXECUTED", "FAILURE",
    "HEADER_ATTEMPT", "HEADER_EXPIRES", "HEADER_LEAVING", "HEADER_NAMES", "HEADER_ORIGIN",
    "HEADER_PARENT_ID", "HEADER_ROOT_ID", "HEADER_TIMELIMIT", "HEADER_WORKER_ID",
    "MAX_BODY_BYTES", "Message", "NO_RESULT", "NOTIFY", "Notify", "PENDING", "REQUEST",
    "RESPONSE", "REVERT", "REVERTED", "RUNNING", "Request", "Response", "SUCCESS", "WAITING",
    "WorkUnit", "build_a_machine", "failure_to_dict", "make_an_event", "make_origin",
    "make_worker_id", "parse_expires", "reply_queue_name", "topic_queue_name",
    "worker_queue_name", "worker_routing_key",
]
