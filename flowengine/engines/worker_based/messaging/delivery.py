"""A received message and its settlement: acknowledged, rejected or given back, once.

Who settles a message, in one place:

* the dispatcher *refuses* a message that is invalid (unknown type, missing
  property, undecodable or schema-invalid body, bad signature, or one kombu
  could not read): nothing acts on it, and the consumer copies it into its
  dead-letter queue with the reason (:mod:`.dead_letters`) and acknowledges
  it;
* a handler that takes responsibility for its message settles it itself: a
  worker acknowledges a request only once it answers for it (its PENDING
  reply, see :mod:`..worker_side.intake`), and gives it back when it cannot;
* any other message is *acknowledged* by the consumer once its handler
  returned (a handler's error included: a message that made a handler fail
  once would make it fail again, so it is not redelivered).

Only :class:`Delivery` calls kombu's ``ack``/``reject``/``requeue``. A
transport that settled a message on the server in the same step as a reply
(flowengine's Redis transport) is recorded with :meth:`Delivery.settled_by_transport`,
so nothing acknowledges it a second time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire.json_text import read_json

LOG = logging.getLogger(__name__)

__all__ = ["Delivery"]

#: What every message of ours is, as kombu's message properties say it
#: (publisher.py writes them); bodies like that are decoded without kombu's
#: serializer registry.
CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"

#: Settlement outcomes, as :attr:`Delivery.outcome` reports them.
ACKED = "acked"
REJECTED = "rejected"
REQUEUED = "requeued"


class Delivery:
    """One message as the consume loop received it, settled at most once.

    Reads like a kombu message (``properties``, ``headers``, ``body``,
    ``delivery_tag``, ``channel``, ``decode()``) so handlers written for
    TaskFlow's dispatcher keep working.
    """

    __slots__ = ("message", "outcome", "refusal")

    def __init__(self, message: Any) -> None:
        #: The kombu message.
        self.message = message
        #: None until settled; then ACKED, REJECTED or REQUEUED.
        self.outcome: str | None = None
        #: Why it was refused (see :meth:`refuse`); None while it is not.
        self.refusal: str | None = None

    @property
    def properties(self) -> Mapping[str, Any]:
        """The message's properties (``type``, ``reply_to``, ``correlation_id``, ...)."""
        return self.message.properties or {}

    @property
    def headers(self) -> Mapping[str, Any]:
        """The message's headers (empty when it has none)."""
        return self.message.headers or {}

    @property
    def body(self) -> Any:
        """The raw body (bytes or str)."""
        return self.message.body

    @property
    def delivery_tag(self) -> Any:
        """The transport's tag of this delivery."""
        return self.message.delivery_tag

    @property
    def channel(self) -> Any:
        """The channel it arrived on."""
        return self.message.channel

    @property
    def redelivered(self) -> bool:
        """True when the broker says it may have delivered this message before.

        RabbitMQ sets the flag on every message it may have delivered before,
        a node crash included (false means never seen before); kombu's own
        Redis transport sets it on what it restores.
        """
        info = getattr(self.message, "delivery_info", None) or {}
        return bool(info.get("redelivered"))

    @property
    def settled(self) -> bool:
        """True once acknowledged, rejected or given back."""
        return self.outcome is not None

    def decode(self) -> Any:
        """The decoded body (kombu's decoding; raises on a bad body).

        A plain JSON body (utf-8, uncompressed: what every flowengine and
        TaskFlow peer sends) is read as kombu's JSON reader reads it
        (wire/json_text.py), not through kombu's serializer registry (a
        lookup by content type, the accept check, the encoding's decoding):
        1.5 us less per message. Any other body goes through the registry,
        which refuses what the consumer does not accept.
        """
        message = self.message
        if (
            message.content_type == CONTENT_TYPE
            and message.content_encoding == CONTENT_ENCODING
            and not (message.headers or {}).get("compression")
        ):
            return read_json(message.body)
        return message.decode()

    def ack(self) -> None:
        """Acknowledge it; DeliveryNotSettled when the broker could not be told.

        The caller must then not act on the message: the broker still has it
        (or already gave it to another consumer).
        """
        self._settling(ACKED)
        try:
            self.message.ack()
        except Exception as e:
            self.outcome = None
            raise exc.DeliveryNotSettled(
                f"Could not acknowledge message {self.delivery_tag} ({e}); the broker keeps it",
                cause=e,
            ) from e

    def refuse(self, reason: str) -> None:
        """Mark it refused for ``reason``: its consumer dead-letters it, then acknowledges it."""
        if self.refusal is None:
            self.refusal = reason

    def reject(self) -> None:
        """Reject it for good (never redelivered); a failure to say so is logged."""
        self._settling(REJECTED)
        try:
            self.message.reject(requeue=False)
        except Exception:
            LOG.warning(
                "Could not reject message %s; the broker may deliver it again",
                self.delivery_tag,
                exc_info=True,
            )

    def requeue(self) -> None:
        """Give it back to its queue for another delivery; a failure is logged."""
        self._settling(REQUEUED)
        try:
            self.message.requeue()
        except Exception:
            LOG.warning(
                "Could not give message %s back; the broker keeps it until this connection ends",
                self.delivery_tag,
                exc_info=True,
            )

    def settled_by_transport(self) -> None:
        """The transport settled it itself: record that.

        It was acknowledged server-side with a reply (flowengine's Redis
        transport), or delivered needing no acknowledgement (a reply queue
        on AMQP, see :class:`..consumer.QueueSpec`).
        """
        self._settling(ACKED)

    def _settling(self, outcome: str) -> None:
        if self.outcome is not None:  # a bug in the caller, not a broker problem
            raise RuntimeError(
                f"message {self.delivery_tag} is already {self.outcome};"
                f" it cannot also be {outcome}"
            )
        self.outcome = outcome
