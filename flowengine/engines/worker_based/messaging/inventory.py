"""The queues of an exchange, their depths and consumers; purging one.

How the queues are found depends on the broker:

* kombu's virtual transports (flowengine's Redis and filesystem ones) keep
  an exchange's bindings themselves (a Redis set, a file in the control
  folder): every queue bound to the exchange is listed;
* AMQP has no way to list queues without RabbitMQ's management plugin, so
  the queues come from the live workers (each names the queues it consumes
  in its ``inspect`` answer) plus any named by the caller; each is then
  checked with a passive declare.

Depths are the messages ready in the queue (not those delivered and not yet
acknowledged). Consumers are the broker's count on AMQP; the virtual
transports keep none, so there they are the live workers consuming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from kombu.connection import Connection
from kombu.transport import virtual

from flowengine import exceptions as exc
from flowengine.engines.worker_based.messaging import compat
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import failover, topology

LOG = logging.getLogger(__name__)

#: Where a consumer count comes from.
FROM_BROKER = "broker"
FROM_WORKERS = "workers"


@dataclasses.dataclass(frozen=True)
class QueueInfo:
    """One queue: its name, messages ready, consumers (and where that count comes from)."""

    name: str
    messages: int
    consumers: int
    consumers_from: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)


class QueueNotFound(exc.FlowEngineError):
    """The named queue does not exist on the broker."""


def _bound_queues(channel: Any, exchange: str) -> set[str]:
    """Queues bound to ``exchange``, on a virtual transport (empty set elsewhere)."""
    if not isinstance(channel, virtual.Channel):
        return set()
    try:
        return {queue for _key, _pattern, queue in channel.get_table(exchange)}
    except Exception:  # the exchange was never declared there
        LOG.debug("No bindings for exchange %r", exchange, exc_info=True)
        return set()


def _declare_passive(
    conn: Any, channel: Any, name: str, bound: set[str] | None = None
) -> tuple[Any, tuple[int, int] | None]:
    """(channel to use next, (messages, consumers) or None when the queue does not exist).

    A failed passive declare closes an AMQP channel: a new one is opened. On
    a virtual transport an empty queue may have no storage at all (Redis
    drops an empty list): one bound to the exchange (``bound``) exists. A
    transport that cannot tell whether a queue exists (kombu says yes to
    any name: the filesystem) has those bound and those holding messages.
    """
    if isinstance(channel, virtual.Channel):
        if bound is not None and name in bound:
            return channel, (int(channel._size(name)), 0)
        if type(channel)._has_queue is virtual.Channel._has_queue:
            size = int(channel._size(name))
            return channel, ((size, 0) if size else None)
    try:
        _queue, messages, consumers = channel.queue_declare(queue=name, passive=True)
        return channel, (int(messages), int(consumers))
    except tuple(conn.channel_errors):
        return conn.channel(), None


def describe_queues(
    broker: BrokerSettings, exchange: str, known: Iterable[str], consumers_seen: dict[str, int]
) -> list[QueueInfo]:
    """The queues of ``exchange`` (plus ``known`` ones that exist), sorted by name.

    ``consumers_seen``: queue -> live workers consuming it (the count shown
    where the broker keeps none). Raises the broker's connection errors.
    """
    with failover.connect_any(broker.connection()) as conn:
        channel = conn.channel()
        from_broker = not isinstance(channel, virtual.Channel)
        bound = _bound_queues(channel, exchange)
        names = set(known) | bound
        found = []
        for name in sorted(names):
            channel, counts = _declare_passive(conn, channel, name, bound)
            if counts is None:
                continue
            messages, consumers = counts
            if from_broker:
                found.append(QueueInfo(name, messages, consumers, FROM_BROKER))
            else:
                found.append(QueueInfo(name, messages, consumers_seen.get(name, 0), FROM_WORKERS))
        return found


def ready_in(conn: Connection, channel: Any, exchange: str, name: str, uri: str) -> tuple[Any, int]:
    """(channel to use next, messages ready in queue ``name`` of ``exchange``), on ``conn``.

    QueueNotFound (saying ``uri``) when there is no such queue.
    """
    channel, counts = _declare_passive(conn, channel, name, _bound_queues(channel, exchange))
    if counts is None:
        raise QueueNotFound(f"no queue {name!r} on {uri}")
    return channel, counts[0]


def queue_depth(broker: BrokerSettings, exchange: str, name: str) -> int:
    """Messages ready in queue ``name`` (of ``exchange``); QueueNotFound when there is none."""
    with failover.connect_any(broker.connection()) as conn:
        _channel, depth = ready_in(conn, conn.channel(), exchange, name, broker.public_uri)
    return depth


def purge_queue(broker: BrokerSettings, exchange: str, name: str) -> int:
    """Remove the messages ready in queue ``name``; how many (QueueNotFound: none such)."""
    with failover.connect_any(broker.connection()) as conn:
        channel, _depth = ready_in(conn, conn.channel(), exchange, name, broker.public_uri)
        purged = channel.queue_purge(queue=name)
    return int(purged or 0)


def needs_dropping(
    broker: BrokerSettings,
    already_deleted: bool,
    template: Connection,
    outlives_connection: bool = False,
) -> bool:
    """Whether a private auto-delete queue is still there once its consumer stopped.

    Not on AMQP (unless durable, or declared to outlive its connection):
    RabbitMQ deletes an auto-delete queue when its consumer goes. Not when
    the consumer says its private queues went with it (``already_deleted``:
    its retired lease deleted them on Redis, its clean stop on memory, the
    filesystem, or RabbitMQ). Saves a short-lived consumer's stop a
    connection and a few round trips (drop_queue). ``template``: a (not
    connected) connection to ``broker`` to tell the transport by (a proxy's
    ``template_connection``).
    """
    if already_deleted:
        return False
    if broker.durable or outlives_connection:
        return True  # not auto-delete on RabbitMQ (topology.make_queue)
    return not topology.deletes_auto_delete_queues(template)


def drop_queue(
    broker: BrokerSettings,
    exchange_name: str,
    queue_name: str,
    routing_keys: Sequence[str],
    *,
    auto_delete: bool,
    outlives_connection: bool = False,
) -> None:
    """Unbind, delete and empty a queue nobody consumes any more; never raises.

    kombu's virtual transports (filesystem, redis, memory) ignore
    auto_delete: left bound, such a queue would collect messages for ever.
    The queue is declared again first (as its consumer declared it: a
    durable mismatch would fail) so that this connection knows the bindings
    to remove. A broker that cannot be reached is logged at DEBUG.
    """
    exchange = compat.make_exchange(exchange_name, durable=broker.durable, compat=broker.compat)
    try:
        with failover.connect_any(broker.connection()) as conn:
            queue = topology.make_queue(
                queue_name,
                exchange,
                tuple(routing_keys),
                auto_delete=auto_delete,
                durable=broker.durable,
                queue_type=broker.queue_type,
                outlives_connection=(
                    outlives_connection and topology.deletes_auto_delete_queues(conn)
                ),
            )
            bound = queue(conn.default_channel)
            bound.declare()
            bound.delete()
            if isinstance(conn.default_channel, virtual.Channel):
                bound.purge()
    except Exception:
        LOG.debug("Could not remove queue %s", queue_name, exc_info=True)
