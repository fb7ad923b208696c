"""CONTROL messages: asking live flowengine workers about themselves, or to act.

A control request is broadcast on the routing key :data:`CONTROL_ROUTING_KEY`
(every flowengine worker of the exchange binds it to a control queue of its
own) or sent to one worker (:func:`worker_control_key`). Each worker it
concerns answers with a CONTROL_REPLY to the request's ``reply_to`` (no
``reply_to``: nobody waits, nobody answers).

These are flowengine's own messages: TaskFlow's workers never bind the
control keys, so they never see one; a CONTROL message that reached a
TaskFlow queue anyway is rejected there as an unknown type, unanswered.
Bodies are JSON validated against the schemas below before anything acts on
them; with signing on they are signed and verified like every message.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flowengine.engines.worker_based.wire.messages import Message
from flowengine.engines.worker_based.wire.schemas import check, compile_schema

#: Message type of a control request and of a worker's answer to one.
CONTROL = "CONTROL"
CONTROL_REPLY = "CONTROL_REPLY"

#: Routing key every flowengine worker of an exchange listens to for control requests.
CONTROL_ROUTING_KEY = "flowengine.control"

# The commands: read-only ones first.
PING = "ping"
ACTIVE = "active"
RESERVED = "reserved"
STATS = "stats"
REGISTERED = "registered"
CANCEL = "cancel"
SHUTDOWN = "shutdown"
INSPECT_COMMANDS = (PING, ACTIVE, RESERVED, STATS, REGISTERED)
COMMANDS = (*INSPECT_COMMANDS, CANCEL, SHUTDOWN)


def worker_control_key(worker_id: str) -> str:
    """Routing key reaching the control queue of one worker only."""
    return f"{CONTROL_ROUTING_KEY}.{worker_id}"


def control_queue_name(exchange: str, worker_id: str) -> str:
    """A worker's control queue (private: deleted with the worker)."""
    return f"{exchange}_control.{worker_id}"


_ARGUMENTS_SCHEMAS: dict[str, dict[str, Any]] = {
    CANCEL: {
        "type": "object",
        "properties": {"request": {"type": "string", "minLength": 1}},
        "required": ["request"],
        "additionalProperties": False,
    },
}
_NO_ARGUMENTS = {"type": "object", "additionalProperties": False}

#: Schema of a control request body.
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": list(COMMANDS)},
        "arguments": {"type": "object"},
        # Worker ids the request is for (absent or null: every worker).
        "destination": {
            "oneOf": [{"type": "null"}, {"type": "array", "items": {"type": "string"}}]
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}

#: Schema of a worker's answer.
REPLY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "worker_id": {"type": "string"},
        "command": {"type": "string"},
        "ok": {"type": "boolean"},
        "result": {"type": "object"},
        "error": {"type": "string"},
    },
    "required": ["worker_id", "command", "ok"],
    "additionalProperties": False,
}

_REQUEST_VALIDATOR = compile_schema(REQUEST_SCHEMA)
_REPLY_VALIDATOR = compile_schema(REPLY_SCHEMA)
_ARGUMENTS_VALIDATORS = {
    name: compile_schema(_ARGUMENTS_SCHEMAS.get(name, _NO_ARGUMENTS)) for name in COMMANDS
}


@dataclasses.dataclass(frozen=True)
class ControlRequest(Message):
    """A control command for workers (all of them, or those in ``destination``)."""

    command: str
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    destination: tuple[str, ...] | None = None

    TYPE = CONTROL

    def to_dict(self) -> dict[str, Any]:
        """The body to publish."""
        body: dict[str, Any] = {"command": self.command, "arguments": dict(self.arguments)}
        if self.destination is not None:
            body["destination"] = list(self.destination)
        return body

    def concerns(self, worker_id: str) -> bool:
        """Whether worker ``worker_id`` should act on (and answer) this request."""
        return self.destination is None or worker_id in self.destination

    @staticmethod
    def validate(data: Any) -> None:
        """Check a received body, its command's arguments included; raise InvalidFormat."""
        check(_REQUEST_VALIDATOR, data, "Control request")
        check(
            _ARGUMENTS_VALIDATORS[data["command"]],
            data.get("arguments", {}),
            f"Arguments of control command {data['command']!r}",
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControlRequest:
        """Build from a body (validated here; InvalidFormat when it is not valid)."""
        cls.validate(data)
        destination = data.get("destination")
        return cls(
            data["command"],
            dict(data.get("arguments") or {}),
            None if destination is None else tuple(destination),
        )


@dataclasses.dataclass(frozen=True)
class ControlReply(Message):
    """One worker's answer to a control request: its result, or why it could not act."""

    worker_id: str
    command: str
    ok: bool
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None

    TYPE = CONTROL_REPLY

    def to_dict(self) -> dict[str, Any]:
        """The body to publish."""
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "command": self.command,
            "ok": self.ok,
            "result": self.result,
        }
        if self.error is not None:
            body["error"] = self.error
        return body

    @staticmethod
    def validate(data: Any) -> None:
        """Check a received answer; raise InvalidFormat naming the problem."""
        check(_REPLY_VALIDATOR, data, "Control reply")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControlReply:
        """Build from a body (validated here; InvalidFormat when it is not valid)."""
        cls.validate(data)
        return cls(
            data["worker_id"],
            data["command"],
            data["ok"],
            dict(data.get("result") or {}),
            data.get("error"),
        )
