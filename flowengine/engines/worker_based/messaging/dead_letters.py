"""Dead-letter queues: where a consume loop puts each message it refuses.

A message that cannot be read or validated at any layer (kombu's: headers,
compression, encoding; flowengine's: size, signature, JSON, schema, type,
properties) is copied here with the reason, then acknowledged: it is
settled once, never given back to be taken again, and an operator can read
it and put it back once the cause is fixed (``flowengine deadletters``).

Names: the dead letters of a shared queue (a topic's) go to ``<queue>.dead``;
those of a process's private queues (a worker's own, an engine's or a
control client's reply queue, an event receiver's), whose names are one-off
ids, go to one ``<exchange>.dead`` per exchange. Each dead-letter queue is
bound to the exchange with its own name as routing key, durable when the
broker settings are (and a quorum queue when they say so), never
auto-deleted, declared the first time it is needed.

A dead letter keeps the body as received (not decompressed, not decoded;
cut to :data:`MAX_KEPT_BODY_BYTES`) and says in its headers why it was
refused, where it came from and what it carried (see ``HEADER_*``), so that
:func:`.dead_letter_reader.requeue_message` can publish it again as it was.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer

from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.transports import topology
from flowengine.engines.worker_based.wire import clock

LOG = logging.getLogger(__name__)

__all__ = [
    "HEADER_REASON",
    "SUFFIX",
    "DeadLetters",
    "dead_letter_queue_name",
    "is_dead_letter_queue",
    "original_message",
]

SUFFIX = ".dead"

#: Why the message was refused (one line).
HEADER_REASON = "x-dead-reason"
#: The queue it was taken from.
HEADER_QUEUE = "x-dead-queue"
#: Where it was published to: exchange and routing key (requeue sends it there again).
HEADER_EXCHANGE = "x-dead-exchange"
HEADER_ROUTING_KEY = "x-dead-routing-key"
#: When it was refused (epoch seconds).
HEADER_AT = "x-dead-at"
#: Its properties (type, correlation_id, reply_to, content type...) and its
#: headers, as JSON text (anything not JSON-able as its repr).
HEADER_PROPERTIES = "x-dead-properties"
HEADER_HEADERS = "x-dead-headers"
#: Present when the body kept was cut: the size (bytes) of the body received.
HEADER_TRUNCATED = "x-dead-truncated"
#: Which consume loop refused it ("<name> on <host:pid>").
HEADER_BY = "x-dead-by"

#: Longest body kept in a dead letter: enough to see what it was, bounded so
#: that refusing a flood of oversized messages cannot fill the broker.
MAX_KEPT_BODY_BYTES = 64 * 1024

#: Message properties copied into a dead letter (and restored by requeue).
KEPT_PROPERTIES = (
    "type",
    "correlation_id",
    "reply_to",
    "priority",
    "delivery_mode",
    "expiration",
    "message_id",
    "timestamp",
    "app_id",
    "user_id",
)


def dead_letter_queue_name(queue: str, exchange: str, private: bool) -> str:
    """Where the dead letters of ``queue`` go (see the module's docstring)."""
    return f"{exchange}{SUFFIX}" if private else f"{queue}{SUFFIX}"


def is_dead_letter_queue(name: str) -> bool:
    """True for a dead-letter queue's name."""
    return name.endswith(SUFFIX)


class DeadLetters:
    """Copies refused messages into dead-letter queues, on the consume loop's connection.

    ``routes`` maps each routing key the loop's queues are bound with to
    (queue name, dead-letter queue name); a message whose routing key is
    not there goes with ``default``. Only the consume loop's thread uses it
    (as only it may use the connection); :meth:`use` gives it each new
    connection.
    """

    def __init__(
        self,
        exchange: Exchange,
        durable: bool,
        routes: Mapping[str, tuple[str, str]],
        default: tuple[str, str],
        refused_by: str,
        queue_type: str = topology.CLASSIC,
    ) -> None:
        self._exchange = exchange
        self._durable = durable
        self._queue_type = queue_type
        self._routes = dict(routes)
        self._default = default
        self._refused_by = refused_by
        self._conn: Connection | None = None
        self._producer: Producer | None = None
        self._declared: set[str] = set()
        #: Messages dead-lettered so far, per dead-letter queue (tests, stats).
        self.counts: dict[str, int] = {}

    def use(self, conn: Connection) -> None:
        """Publish on ``conn`` from now on (the loop connected again)."""
        if conn is not self._conn:
            self._conn, self._producer = conn, None
            self._declared.clear()

    def put(self, delivery: Delivery, reason: str) -> str:
        """Copy ``delivery`` with ``reason`` into its dead-letter queue; that queue's name.

        Raises what publishing raised (the caller decides: a broken
        connection is reconnected and the message, still unsettled, comes
        again).
        """
        info = getattr(delivery.message, "delivery_info", None) or {}
        routing_key = info.get("routing_key")
        queue, dead_queue = (
            self._routes.get(routing_key, self._default)
            if isinstance(routing_key, str)
            else self._default
        )
        body = delivery.body
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogateescape")
        elif not isinstance(body, bytes):
            body = b"" if body is None else _json_text(body).encode("utf-8")
        headers = {
            HEADER_REASON: reason,
            HEADER_QUEUE: queue,
            HEADER_EXCHANGE: info.get("exchange")
            if isinstance(info.get("exchange"), str)
            else self._exchange.name,
            HEADER_ROUTING_KEY: routing_key if isinstance(routing_key, str) else "",
            HEADER_AT: round(clock.wall(), 6),
            HEADER_PROPERTIES: _json_text(_kept_properties(delivery)),
            HEADER_HEADERS: _json_text(_raw_headers(delivery)),
            HEADER_BY: self._refused_by,
        }
        if len(body) > MAX_KEPT_BODY_BYTES:
            headers[HEADER_TRUNCATED] = len(body)
            body = body[:MAX_KEPT_BODY_BYTES]
        producer = self._producer_for(dead_queue)
        producer.publish(
            body,
            routing_key=dead_queue,
            headers=headers,
            content_type="application/octet-stream",
            content_encoding="binary",
            delivery_mode=2 if self._durable else 1,
        )
        self.counts[dead_queue] = self.counts.get(dead_queue, 0) + 1
        return dead_queue

    def _producer_for(self, dead_queue: str) -> Producer:
        if self._conn is None:
            raise RuntimeError("DeadLetters.use() was not called with a connection")
        if self._producer is None:
            channel = self._conn.channel()
            self._exchange.declare(channel=channel)
            self._producer = Producer(channel, exchange=self._exchange, auto_declare=False)
        if dead_queue not in self._declared:
            declare_queue(
                self._producer.channel, self._exchange, dead_queue, self._durable, self._queue_type
            )
            self._declared.add(dead_queue)
        return self._producer


def declare_queue(
    channel: Any, exchange: Exchange, name: str, durable: bool, queue_type: str = topology.CLASSIC
) -> Queue:
    """Declare dead-letter queue ``name`` bound to ``exchange`` with its name as routing key.

    A quorum queue with ``queue_type='quorum'`` (durable): see :mod:`..transports.topology`.
    """
    queue = Queue(
        name,
        exchange=exchange,
        routing_key=name,
        durable=durable,
        auto_delete=False,
        queue_arguments=topology.queue_type_arguments(durable, queue_type) or None,
    )
    bound = queue(channel)
    bound.declare()
    return bound


def original_message(headers: Mapping[str, Any]) -> dict[str, Any]:
    """What a dead letter says of the message it keeps: publish() keyword arguments.

    ``exchange``, ``routing_key``, ``headers``, ``content_type``,
    ``content_encoding`` and the kept properties, as received (``headers``
    may be anything a refused message carried); the ``reason`` and
    ``queue`` of the refusal too.
    """
    properties = _json_value(headers.get(HEADER_PROPERTIES)) or {}
    original_headers = _json_value(headers.get(HEADER_HEADERS)) or {}
    return {
        "reason": headers.get(HEADER_REASON),
        "queue": headers.get(HEADER_QUEUE),
        "exchange": headers.get(HEADER_EXCHANGE),
        "routing_key": headers.get(HEADER_ROUTING_KEY),
        "refused_at": headers.get(HEADER_AT),
        "refused_by": headers.get(HEADER_BY),
        "truncated": headers.get(HEADER_TRUNCATED),
        "properties": properties if isinstance(properties, dict) else {},
        # As received: a mapping, or whatever a refused message carried instead.
        "headers": original_headers,
    }


def _kept_properties(delivery: Delivery) -> dict[str, Any]:
    message = delivery.message
    kept = {
        name: value
        for name, value in delivery.properties.items()
        if name in KEPT_PROPERTIES and value is not None
    }
    kept["content_type"] = getattr(message, "content_type", None)
    kept["content_encoding"] = getattr(message, "content_encoding", None)
    return kept


def _raw_headers(delivery: Delivery) -> Any:
    """The headers as received (a guarded message keeps them even when not a mapping)."""
    message = delivery.message
    return getattr(message, "refused_headers", None) or message.headers


def _json_text(value: Any) -> str:
    """``value`` as JSON text; what JSON cannot hold as its repr."""
    try:
        return json.dumps(value, default=repr, sort_keys=True)
    except (TypeError, ValueError):  # e.g. keys that are not strings
        return json.dumps(repr(value))


def _json_value(text: Any) -> Any:
    if not isinstance(text, (str, bytes)):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None
