"""JSON schemas of the message bodies, their compiled validators and fast paths.

Every body is validated on receipt by a jsonschema validator compiled once
at import (TaskFlow rebuilt them on every message). The usual message
shapes skip jsonschema through hand-written structural checks (the fast
paths), which may only ever accept what the schema accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire.names import (
    EVENT,
    EXECUTE,
    FAILURE,
    PENDING,
    REVERT,
    RUNNING,
    SUCCESS,
    WAITING,
)

#: Schema of a notify *response* (the worker's {topic, tasks}).
NOTIFY_RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "tasks": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["topic", "tasks"],
    "additionalProperties": False,
}

#: Schema of a notify request from its *sender* (an empty object).
NOTIFY_SENDER_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
}

#: Schema of a request body (exactly TaskFlow's).
REQUEST_SCHEMA = {
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

#: Schema of a response body (exactly TaskFlow's).
RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {
        "state": {"type": "string", "enum": [WAITING, PENDING, RUNNING, SUCCESS, FAILURE, EVENT]},
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


def compile_schema(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """Compile a schema once (Draft 4, the dialect TaskFlow's schemas use).

    Raises jsonschema's SchemaError when ``schema`` itself is malformed.
    """
    cls = jsonschema.Draft4Validator
    cls.check_schema(schema)
    return cls(schema)


def check(
    validator: jsonschema.protocols.Validator,
    data: Any,
    what: str,
    fast: Callable[[Any], bool] | None = None,
) -> None:
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


# --- fast paths: sufficient (never necessary) conditions for validity --------
# Each returns True only for data its schema accepts; tests check them against
# the jsonschema validators on generated bodies.

_RESPONSE_STATES = frozenset((WAITING, PENDING, RUNNING, SUCCESS, FAILURE, EVENT))
_COMPLETION_KEYS = frozenset(("result",))
_EVENT_KEYS = frozenset(("event_type", "details"))
_REQUEST_ACTIONS = frozenset((EXECUTE, REVERT))


def response_fast(data: Any) -> bool:
    """RESPONSE_SCHEMA holds for ``data`` (checked by hand for the usual shapes)."""
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
    return (
        keys == _EVENT_KEYS
        and isinstance(payload["event_type"], str)
        and isinstance(payload["details"], dict)
    )


def request_fast(data: Any) -> bool:
    """REQUEST_SCHEMA holds for ``data`` (checked by hand)."""
    if not isinstance(data, dict):
        return False
    action = data.get("action")
    version = data.get("task_version")
    return (
        isinstance(data.get("task_cls"), str)
        and isinstance(data.get("task_name"), str)
        and isinstance(version, (str, list))
        and isinstance(action, str)
        and action in _REQUEST_ACTIONS
        and isinstance(data.get("arguments", {}), dict)
        and isinstance(data.get("failures", {}), dict)
    )


# Compiled once at import (TaskFlow rebuilt them on every message).
NOTIFY_RESPONSE_VALIDATOR = compile_schema(NOTIFY_RESPONSE_SCHEMA)
NOTIFY_SENDER_VALIDATOR = compile_schema(NOTIFY_SENDER_SCHEMA)
REQUEST_VALIDATOR = compile_schema(REQUEST_SCHEMA)
RESPONSE_VALIDATOR = compile_schema(RESPONSE_SCHEMA)
