"""The message base class and the NOTIFY and RESPONSE messages.

A message is built from, and turned back into, a JSON body; ``validate``
checks a received body (nested failures included) before anything acts on
it. REQUEST, the executor's stateful view of a request, has its own module
(:mod:`flowengine.engines.worker_based.wire.request`).
"""

from __future__ import annotations

import abc
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire.failures import failure_to_dict, validate_failure
from flowengine.engines.worker_based.wire.names import (
    EVENT,
    FAILURE,
    NOTIFY,
    RESPONSE,
    SUCCESS,
)
from flowengine.engines.worker_based.wire.schemas import (
    NOTIFY_RESPONSE_SCHEMA,
    NOTIFY_RESPONSE_VALIDATOR,
    NOTIFY_SENDER_SCHEMA,
    NOTIFY_SENDER_VALIDATOR,
    RESPONSE_SCHEMA,
    RESPONSE_VALIDATOR,
    check,
    response_fast,
)
from flowengine.types import failure as ft


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
    RESPONSE_SCHEMA = NOTIFY_RESPONSE_SCHEMA

    #: Schema of a notify request from its *sender* (an empty object).
    SENDER_SCHEMA = NOTIFY_SENDER_SCHEMA

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
            check(NOTIFY_RESPONSE_VALIDATOR, data, "Notify message response data")
        else:
            check(NOTIFY_SENDER_VALIDATOR, data, "Notify message sender data")


class Response(Message):
    """A worker's reply about a request: a state change, an event or the outcome."""

    TYPE = RESPONSE

    #: Schema of a response body (exactly TaskFlow's).
    SCHEMA = RESPONSE_SCHEMA

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
        if (
            isinstance(data, dict)
            and data.get("state") == EVENT
            and "data" not in data
            and "event_type" in data
        ):
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
        check(RESPONSE_VALIDATOR, data, "Response message data", response_fast)
        state, payload = data["state"], data["data"]
        if state in (SUCCESS, FAILURE) and "result" not in payload:
            raise exc.InvalidFormat(
                f"Response message data not of the expected format:"
                f" a {state} response needs data.result (at $.data)"
            )
        if state == EVENT and "event_type" not in payload:
            raise exc.InvalidFormat(
                "Response message data not of the expected format:"
                " an EVENT response needs data.event_type and"
                " data.details (at $.data)"
            )
        if state == FAILURE:
            validate_failure(payload["result"], "Response failure (at $.data.result)")
