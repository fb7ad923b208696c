"""Reading dead-letter queues and putting their messages back (``flowengine deadletters``).

What a consume loop refused sits in a dead-letter queue (see
:mod:`.dead_letters`) until an operator reads it and, once the cause is
fixed, requeues it: :func:`requeue_dead_letters` publishes the message it
keeps to the exchange and routing key it was first published to, with its
content type and encoding, its kept properties and its headers (a signed
message stays signed: nothing covered by its signature changes), then
removes it from the dead-letter queue.

Reading loses nothing, whatever happens to the reader:

* on flowengine's Redis transport the queue is only looked at (``LRANGE``);
  a requeued message is removed (``LREM``) once its copy is published;
* elsewhere messages are taken unacknowledged (``basic_get``): the broker
  keeps them until told. A requeued one is acknowledged once its copy is
  published (on RabbitMQ, once the broker confirmed it); the others are
  given back, oldest first. RabbitMQ puts them back where they were (and
  does so by itself if the reader dies); the memory and filesystem
  transports at the end of the queue, in their order (the filesystem
  transport's consumers put back what a dead reader claimed).

So a crash between publishing and removing leaves the message in both
places (requeued twice at worst), never in neither. Requeueing stops at the
first message the broker does not take (no such exchange, nothing bound to
the routing key): it stays, and so do the ones after it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Collection, Iterator
from typing import Any

from kombu.connection import Connection
from kombu.entity import Queue
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from flowengine import exceptions as exc
from flowengine.engines.worker_based.messaging import inventory
from flowengine.engines.worker_based.messaging.dead_letters import (
    SUFFIX,
    is_dead_letter_queue,
    original_message,
)
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import failover

LOG = logging.getLogger(__name__)

__all__ = [
    "DeadLetter",
    "NotADeadLetterQueue",
    "RequeueReport",
    "check_name",
    "read_dead_letters",
    "requeue_dead_letters",
    "requeue_message",
    "utc_text",
]

#: Characters of a body shown by :meth:`DeadLetter.as_dict` (``body_excerpt``).
EXCERPT_CHARS = 2000

#: Property types a broker accepts; a kept property of another type (e.g. an
#: AMQP timestamp kept as its repr) is left out when the message is requeued.
_PROPERTY_TYPES: dict[str, tuple[type, ...]] = {
    "type": (str,),
    "correlation_id": (str,),
    "reply_to": (str,),
    "message_id": (str,),
    "app_id": (str,),
    "user_id": (str,),
    "expiration": (str,),
    "priority": (int,),
    "delivery_mode": (int,),
    "timestamp": (int, float),
}


class NotADeadLetterQueue(exc.FlowEngineError):
    """The queue named is not a dead-letter queue."""


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """One dead letter: where it was in its queue (from 1, oldest first) and what it says."""

    index: int
    reason: str | None
    queue: str | None
    exchange: str | None
    routing_key: str | None
    refused_at: float | None
    refused_by: str | None
    #: The size (bytes) of the body received, when the body kept was cut.
    truncated: int | None
    properties: dict[str, Any]
    headers: dict[str, Any]
    #: The headers as refused when they were not a mapping (else None).
    odd_headers: Any
    body: bytes

    @classmethod
    def from_message(cls, index: int, message: Any) -> DeadLetter:
        """The dead letter kombu ``message`` is (read from a dead-letter queue)."""
        headers = dict(message.headers or {})
        original = original_message(headers)
        # Headers that were not a mapping (why it was refused) are shown,
        # never sent again as headers.
        received = original["headers"]
        odd = None if received is None or isinstance(received, dict) else received
        body = message.body
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogateescape")
        truncated = original["truncated"]
        refused_at = original["refused_at"]
        return cls(
            index=index,
            reason=_text_or_none(original["reason"]),
            queue=_text_or_none(original["queue"]),
            exchange=_text_or_none(original["exchange"]),
            routing_key=_text_or_none(original["routing_key"]),
            refused_at=float(refused_at) if isinstance(refused_at, (int, float)) else None,
            refused_by=_text_or_none(original["refused_by"]),
            truncated=int(truncated) if isinstance(truncated, int) else None,
            properties=original["properties"],
            headers=received if isinstance(received, dict) else {},
            odd_headers=odd,
            body=bytes(body or b""),
        )

    @property
    def type(self) -> Any:
        """The message's ``type`` property."""
        return self.properties.get("type")

    @property
    def correlation_id(self) -> Any:
        """The message's ``correlation_id`` property."""
        return self.properties.get("correlation_id")

    @property
    def refused_at_text(self) -> str:
        """When it was refused, as UTC time (``-`` when unknown)."""
        return utc_text(self.refused_at)

    def unsendable(self) -> str | None:
        """Why it cannot be requeued as it was (None: it can)."""
        if self.truncated is not None:
            return (
                f"its body was cut to {len(self.body)} of its {self.truncated} bytes when"
                f" it was dead-lettered"
            )
        if self.exchange is None or self.routing_key is None:
            return "it does not say which exchange and routing key it was published to"
        return None

    def as_dict(self, *, body: bool = True) -> dict[str, Any]:
        """JSON-ready; with the body (an excerpt, and whole in base64) unless ``body=False``."""
        row: dict[str, Any] = {
            "index": self.index,
            "reason": self.reason,
            "queue": self.queue,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "refused_at": self.refused_at,
            "refused_at_utc": self.refused_at_text,
            "refused_by": self.refused_by,
            "type": self.type,
            "correlation_id": self.correlation_id,
            "body_bytes": len(self.body),
            "truncated_from": self.truncated,
        }
        if body:
            row.update(
                properties=self.properties,
                headers=self.headers,
                body_excerpt=self.body_excerpt(),
                body_base64=base64.b64encode(self.body).decode("ascii"),
            )
            if self.odd_headers is not None:
                row["odd_headers"] = self.odd_headers
        return row

    def body_excerpt(self, chars: int = EXCERPT_CHARS) -> str:
        """The body's first ``chars`` characters (UTF-8; other bytes escaped)."""
        text = self.body[: chars * 4].decode("utf-8", "backslashreplace")
        return text[:chars] + ("..." if len(text) > chars or len(self.body) > chars * 4 else "")


@dataclasses.dataclass
class RequeueReport:
    """What :func:`requeue_dead_letters` did."""

    #: Published again and removed from the dead-letter queue.
    requeued: list[DeadLetter] = dataclasses.field(default_factory=list)
    #: Left in the dead-letter queue, with why.
    kept: list[tuple[DeadLetter, str]] = dataclasses.field(default_factory=list)
    #: Indexes asked for that the queue did not have.
    missing: list[int] = dataclasses.field(default_factory=list)
    #: Requeued, but gone from the dead-letter queue before this could
    #: remove it (another reader took it meanwhile): it may have been requeued twice.
    already_gone: list[DeadLetter] = dataclasses.field(default_factory=list)


def utc_text(epoch: float | None) -> str:
    """``epoch`` (seconds) as ``YYYY-MM-DD HH:MM:SS`` UTC; ``-`` for None."""
    if epoch is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def check_name(queue: str) -> None:
    """NotADeadLetterQueue unless ``queue`` names a dead-letter queue."""
    if not is_dead_letter_queue(queue):
        raise NotADeadLetterQueue(
            f"{queue!r} is not a dead-letter queue (their names end in {SUFFIX!r}; see"
            f" flowengine queues)"
        )


def read_dead_letters(
    broker: BrokerSettings, exchange: str, queue: str, limit: int | None = None
) -> list[DeadLetter]:
    """The dead letters in ``queue`` (of ``exchange``), oldest first; all but ``limit``.

    They stay in the queue, in their order (see the module's docstring).
    Raises NotADeadLetterQueue, QueueNotFound, and the broker's errors.
    """
    with _reader(broker, exchange, queue) as reader:
        return [taken.letter for taken in reader.read(limit)]


def requeue_dead_letters(
    broker: BrokerSettings, exchange: str, queue: str, indexes: Collection[int] | None = None
) -> RequeueReport:
    """Publish the dead letters at ``indexes`` (from 1; None: all) again; what happened.

    Each goes to its original exchange and routing key as it was, and is
    then removed from ``queue``; those not chosen stay. Raises
    NotADeadLetterQueue, QueueNotFound, and the broker's connection errors.
    """
    wanted = None if indexes is None else sorted(set(indexes))
    report = RequeueReport()
    with _reader(broker, exchange, queue, publishing=True) as reader:
        read = reader.read(None)
        by_index = {taken.letter.index: taken for taken in read}
        if wanted is not None:
            report.missing = [i for i in wanted if i not in by_index]
        chosen = read if wanted is None else [by_index[i] for i in wanted if i in by_index]
        for position, taken in enumerate(chosen):
            letter = taken.letter
            why = letter.unsendable() or reader.unroutable(letter)
            if why is not None:
                report.kept.append((letter, why))
                continue
            try:
                requeue_message(reader.channel, letter, mandatory=reader.is_amqp)
            except reader.broker_errors as e:
                # The broker refused it (on AMQP its channel may be closed: then
                # the broker gives back what was taken by itself). Stop there.
                report.kept.append((letter, f"the broker refused it ({_one_line(e)})"))
                report.kept.extend(
                    (later.letter, f"not tried after the broker refused dead letter {letter.index}")
                    for later in chosen[position + 1 :]
                )
                break
            if reader.remove(taken):
                report.requeued.append(letter)
            else:
                report.already_gone.append(letter)
    return report


def requeue_message(channel: Any, letter: DeadLetter, *, mandatory: bool = False) -> None:
    """Publish the message ``letter`` keeps on ``channel``, as it was first published.

    Its body, content type and encoding, properties (those a broker accepts)
    and headers, to its original exchange and routing key. ``mandatory``
    (AMQP): the broker returns it when nothing is bound to that key.
    """
    properties = {
        name: value
        for name, value in letter.properties.items()
        if name in _PROPERTY_TYPES
        and isinstance(value, _PROPERTY_TYPES[name])
        and not isinstance(value, bool)
    }
    priority = properties.pop("priority", None)
    content_type = letter.properties.get("content_type")
    content_encoding = letter.properties.get("content_encoding")
    message = channel.prepare_message(
        letter.body,
        priority,
        content_type if isinstance(content_type, str) else None,
        content_encoding if isinstance(content_encoding, str) else None,
        dict(letter.headers),
        properties,
    )
    kwargs = {"mandatory": True} if mandatory else {}
    channel.basic_publish(
        message, exchange=letter.exchange or "", routing_key=letter.routing_key or "", **kwargs
    )


# --- reading without losing ---


@dataclasses.dataclass
class _Taken:
    """A dead letter read, with what settles it: its kombu message, or its Redis list item."""

    letter: DeadLetter
    message: Any
    raw: bytes | None = None
    settled: bool = False


class _Reader:
    """Reads one dead-letter queue on an open connection (see the module's docstring)."""

    def __init__(self, conn: Connection, channel: Any, queue: str, depth: int) -> None:
        self.conn = conn
        self.channel = channel
        self.queue = queue
        self.depth = depth
        self.is_amqp = not isinstance(channel, virtual.Channel)
        self.broker_errors = tuple(conn.channel_errors) + tuple(conn.connection_errors)
        #: True once giving back failed (channel or connection gone): the
        #: broker keeps what was not acknowledged.
        self.broken = False
        self._taken: list[_Taken] = []

    def read(self, limit: int | None) -> list[_Taken]:
        """Up to ``limit`` (None: all) of the queue's messages, oldest first.

        All are taken whatever ``limit``: given back at the end of the queue
        (memory, filesystem), the first ones alone would end up after the others.
        """
        queue = Queue(self.queue, channel=self.channel, no_declare=True)
        while len(self._taken) < self.depth:
            message = queue.get(no_ack=False)
            if message is None:
                break
            self._taken.append(
                _Taken(DeadLetter.from_message(len(self._taken) + 1, message), message)
            )
        return self._taken[:limit]

    def unroutable(self, letter: DeadLetter) -> str | None:
        """Why ``letter`` would reach no queue (None: it would, or only the broker knows)."""
        if self.is_amqp or not letter.exchange:
            return None  # AMQP: published mandatory, so the broker says
        channel = self.channel
        try:
            queues = channel.typeof(letter.exchange).lookup(
                channel.get_table(letter.exchange), letter.exchange, letter.routing_key, None
            )
        except Exception:  # an exchange the transport does not know
            LOG.debug("No bindings for exchange %r", letter.exchange, exc_info=True)
            queues = []
        if queues:
            return None
        return (
            f"no queue is bound to exchange {letter.exchange!r} with routing key"
            f" {letter.routing_key!r}: nothing would receive it (start a worker of that"
            f" topic first)"
        )

    def remove(self, taken: _Taken) -> bool:
        """Remove a dead letter requeued; False when it had gone meanwhile."""
        taken.message.ack()
        taken.settled = True
        return True

    def give_back(self) -> None:
        """Give back every message read and not removed, oldest first."""
        for taken in self._taken:
            if taken.settled or self.broken:
                continue
            try:
                taken.message.reject(requeue=True)
                taken.settled = True
            except self.broker_errors:
                # The channel or connection went: the broker keeps what was
                # not acknowledged (AMQP gives it back by itself).
                LOG.debug("Could not give back dead letter %d", taken.letter.index, exc_info=True)
                self.broken = True


class _RedisReader(_Reader):
    """Looks at a Redis list without taking from it; removes a requeued item by value."""

    def read(self, limit: int | None) -> list[_Taken]:
        count = self.depth if limit is None else min(limit, self.depth)
        if count <= 0:
            return []
        channel = self.channel
        with channel.conn_or_acquire() as client:
            # Pushed on the left, taken from the right: the oldest is last.
            items = client.lrange(channel._q_for_pri(self.queue, 0), -count, -1)
        taken: list[_Taken] = []
        for raw in reversed(items):
            message = channel.Message(loads(bytes_to_str(raw)), channel=channel)
            taken.append(_Taken(DeadLetter.from_message(len(taken) + 1, message), message, raw))
        self._taken = taken
        return list(taken)

    def remove(self, taken: _Taken) -> bool:
        channel = self.channel
        with channel.conn_or_acquire() as client:
            removed = client.lrem(channel._q_for_pri(self.queue, 0), 1, taken.raw)
        taken.settled = True
        return bool(removed)

    def give_back(self) -> None:
        """Nothing was taken."""


def _reads_by_looking(channel: Any) -> bool:
    """Whether ``channel`` is flowengine's Redis channel (one list per queue, no priorities)."""
    from flowengine.engines.worker_based.transports import redis as fe_redis

    return isinstance(channel, fe_redis.Channel) and list(channel.priority_steps) == [0]


@contextlib.contextmanager
def _reader(
    broker: BrokerSettings, exchange: str, queue: str, publishing: bool = False
) -> Iterator[_Reader]:
    """A reader of dead-letter queue ``queue``; what it read and did not remove is given back."""
    check_name(queue)
    options: dict[str, Any] = {}
    if publishing and broker.connection().transport.driver_type == "amqp":
        options["confirm_publish"] = True  # removed only once the broker has the copy
    with failover.connect_any(broker.connection(options or None)) as conn:
        channel, depth = inventory.ready_in(
            conn, conn.channel(), exchange, queue, broker.public_uri
        )
        kind = _RedisReader if _reads_by_looking(channel) else _Reader
        reader = kind(conn, channel, queue, depth)
        try:
            yield reader
        finally:
            reader.give_back()


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
