"""Routes each received message to the handler for its ``type`` property.

Anything wrong with a message (unknown type, missing or mistyped property,
undecodable or schema-invalid body) is logged with its cause, reported to
``on_reject`` so the owner can answer with a FAILURE where a reply address
is known, and the message is refused: its consumer moves it to a
dead-letter queue (see :mod:`.dead_letters`). Who settles the others is said in
:mod:`.delivery`: the consumer acknowledges a message once its handler
returned, unless the handler settles it itself (``Handler(settles=True)``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based.messaging.delivery import Delivery

LOG = logging.getLogger(__name__)

#: Longest excerpt of a bad message body put into a log line.
LOG_BODY_EXCERPT_CHARS = 200


def describe(message: Any) -> str:
    """Short description of a kombu message for log lines (type, ids, size)."""
    props = getattr(message, "properties", None) or {}
    body = getattr(message, "body", b"") or b""
    return (
        f"message (type={props.get('type')!r},"
        f" correlation_id={props.get('correlation_id')!r},"
        f" reply_to={props.get('reply_to')!r}, {len(body)} bytes)"
    )


def _refuse(message: Any, reason: str) -> None:
    """Refuse ``message``: a Delivery is dead-lettered by its consumer, a bare message rejected."""
    if isinstance(message, Delivery):
        message.refuse(reason)
    elif not message.settled:
        message.reject()


class Handler:
    """What to call for messages of one type: a processor and an optional validator."""

    __slots__ = ("_process_message", "_validator", "_required_properties", "settles")

    def __init__(
        self,
        process_message: Callable[[Any, Any], None],
        validator: Callable[[Any], None] | None = None,
        *,
        required_properties: Sequence[str] = (),
        settles: bool = False,
    ) -> None:
        self._process_message = process_message
        self._validator = validator
        self._required_properties = tuple(required_properties)
        #: True: the processor settles each message itself once it has taken
        #: responsibility for it (worker requests, see worker_side.intake);
        #: the consumer acknowledges it when the processor did not.
        self.settles = settles

    @property
    def process_message(self) -> Callable[[Any, Any], None]:
        """Main callback, called with (data, message) once the message is valid."""
        return self._process_message

    @property
    def validator(self) -> Callable[[Any], None] | None:
        """Optional callback run before processing; raises InvalidFormat if invalid."""
        return self._validator

    @property
    def required_properties(self) -> tuple[str, ...]:
        """Message properties (e.g. reply_to, correlation_id) that must be present."""
        return self._required_properties


class TypeDispatcher:
    """Receives messages and dispatches them to type-specific handlers."""

    def __init__(
        self,
        type_handlers: Mapping[str, Handler] | None = None,
        requeue_filters: Iterable[Callable[[Any, Any], bool]] | None = None,
        *,
        on_reject: Callable[[Any, str], None] | None = None,
    ) -> None:
        self._type_handlers = dict(type_handlers or {})
        self._requeue_filters = list(requeue_filters or [])
        self._on_reject = on_reject
        #: How many messages were rejected (any cause), for tests and stats.
        self.rejected_count = 0
        #: How many of those were refused for a missing or bad signature.
        self.unverified_count = 0

    @property
    def type_handlers(self) -> dict[str, Handler]:
        """Message type -> Handler; a message of any other type is rejected."""
        return self._type_handlers

    @property
    def requeue_filters(self) -> list[Callable[[Any, Any], bool]]:
        """Callbacks (data, message) -> bool; any true vote requeues the message unprocessed."""
        return self._requeue_filters

    def reject(self, message: Delivery, reason: str) -> None:
        """Log why ``message`` is refused, tell on_reject, and refuse it (dead-lettered)."""
        self.rejected_count += 1
        LOG.warning("Rejected %s: %s", describe(message), reason)
        if self._on_reject is not None:
            try:
                self._on_reject(message, reason)
            except Exception:
                LOG.exception("on_reject callback failed for %s", describe(message))
        _refuse(message, reason)

    def reject_unverified(self, message: Delivery, reason: str) -> None:
        """Refuse a message whose signature is missing or wrong: logged and counted.

        on_reject is not told: its reply address is untrusted, and answering
        forged messages would let anyone make us send messages for them.
        """
        self.unverified_count += 1
        self.refuse_unread(message, reason)

    def refuse_unread(self, message: Delivery, reason: str) -> None:
        """Refuse a message nobody can vouch for, unread: logged, never answered."""
        self.rejected_count += 1
        LOG.warning("Refused %s unread: %s", describe(message), reason)
        _refuse(message, reason)

    def on_decode_error(self, message: Delivery, error: BaseException) -> None:
        """Called for a body that cannot be decoded (bad JSON, content type not accepted)."""
        body = getattr(message, "body", b"") or b""
        excerpt = body[:LOG_BODY_EXCERPT_CHARS]
        self.reject(
            message, f"undecodable body ({type(error).__name__}: {error}); starts with {excerpt!r}"
        )

    def _collect_requeue_votes(self, data: Any, message: Any) -> int:
        """How many requeue filters vote to requeue (a failing filter votes no)."""
        votes = 0
        for flt in self._requeue_filters:
            try:
                if flt(data, message):
                    votes += 1
            except Exception:
                LOG.exception("Requeue filter %r failed; counting it as no vote", flt)
        return votes

    def on_message(self, data: Any, message: Delivery) -> None:
        """Dispatch one decoded message to its handler; never raises."""
        props = message.properties or {}
        message_type = props.get("type")
        if not message_type:
            self.reject(message, "it has no 'type' property")
            return
        if not isinstance(message_type, str):
            self.reject(
                message, f"its 'type' property is a {type(message_type).__name__}, not a string"
            )
            return
        mistyped = [
            p
            for p in ("reply_to", "correlation_id")
            if props.get(p) is not None and not isinstance(props[p], str)
        ]
        if mistyped:
            self.reject(
                message,
                f"propert{'y' if len(mistyped) == 1 else 'ies'}"
                f" {', '.join(mistyped)} must be strings",
            )
            return
        handler = self._type_handlers.get(message_type)
        if handler is None:
            self.reject(
                message,
                f"unexpected message type {message_type!r}"
                f" (expected one of {sorted(self._type_handlers)})",
            )
            return
        missing = [p for p in handler.required_properties if not props.get(p)]
        if missing:
            self.reject(
                message,
                f"{message_type} message lacks required"
                f" propert{'y' if len(missing) == 1 else 'ies'}"
                f" {', '.join(missing)}",
            )
            return
        if self._requeue_filters and self._collect_requeue_votes(data, message):
            message.requeue()
            return
        if handler.validator is not None:
            try:
                handler.validator(data)
            except exc.InvalidFormat as e:
                self.reject(message, str(e))
                return
            except Exception as e:
                LOG.exception("Validator of %s messages failed", message_type)
                self.reject(message, f"validation error: {e}")
                return
        try:
            handler.process_message(data, message)
        except Exception:
            LOG.exception("Handler of %s messages failed on %s", message_type, describe(message))
