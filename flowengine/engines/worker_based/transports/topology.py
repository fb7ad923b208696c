"""Exchange and queue declarations, transient (default) or durable.

Transient (TaskFlow's topology): a non-durable exchange and queues; a broker
restart loses the queues and the messages waiting in them, and the
executor's deadlines (transition timeout, lost-worker detection) recover.

Durable (``durable=True``): the exchange and every queue survive a broker
restart and messages are published persistent, so requests waiting in a
topic queue are still there when the broker comes back (on Redis this also
needs Redis persistence: ``appendonly yes``). Queues that are auto-deleted in
the transient topology (an executor's reply queue, a worker's private queue)
cannot be both durable and auto-deleted in a useful way, so they are durable
and, on RabbitMQ, expire after ``IDLE_QUEUE_EXPIRES_S`` without consumers;
their owners delete them on a clean stop.

An executor's transient reply queue outlives its consumer's connection on
RabbitMQ (``outlives_connection``): it is not auto-deleted but expires
``RECONNECT_GRACE_S`` after its last consumer went. An auto-delete queue
goes, with what it holds, the moment its consumer's connection breaks, so
every reply a worker sent while the engine reconnected was lost and its
task, finished, was run again once the engine found it lost. Its owner
deletes it on a clean stop; after a crash it expires.

Quorum (``durable=True, queue_type='quorum'``, RabbitMQ only): every queue
of the durable topology is declared a quorum queue (``x-queue-type``): the
topic queues, a worker's private and control queues, an executor's or a
control client's reply queue and the dead-letter queues. A quorum queue is
replicated on (by default) every node of the cluster and a majority of them
holds each message before the publisher's confirm comes back, so a queue,
with what it holds, survives the loss of any minority of the nodes; a
classic durable queue lives on one node and cannot even be declared again
while that node is down. Quorum queues are durable, never exclusive nor
auto-deleted: the durable topology already declares no such queue (the idle
expiry ``x-expires`` works on both types). The events queues (``events/``)
stay transient classic ones: a subscriber's queue is exclusive and events
are fire-and-forget.

Every participant on one exchange (executors and workers) must use the same
settings: RabbitMQ refuses to re-declare an exchange or queue with another
durability or queue type (PRECONDITION_FAILED).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kombu.connection import Connection
from kombu.entity import Exchange, Queue, binding
from kombu.transport import virtual

#: AMQP delivery mode of messages in the durable topology (written to disk).
PERSISTENT_DELIVERY_MODE = 2

#: Queue types (``BrokerSettings.queue_type``): RabbitMQ's classic queues (the
#: only ones the other brokers have) and its replicated quorum queues.
CLASSIC = "classic"
QUORUM = "quorum"
QUEUE_TYPES = (CLASSIC, QUORUM)

#: Seconds a durable reply/private queue may stay without a consumer before
#: RabbitMQ deletes it (``x-expires``): long enough to outlive any broker or
#: network outage its owner would still come back from, short enough that a
#: crashed executor's queue does not collect announcements for ever.
IDLE_QUEUE_EXPIRES_S = 600.0

#: Seconds a transient queue that outlives its consumer's connection stays
#: without a consumer before RabbitMQ deletes it (``x-expires``): the first
#: four reconnection attempts of a consume loop (1 + 2 + 4 + 8 s of backoff),
#: and a crashed owner's queue still goes soon.
RECONNECT_GRACE_S = 15.0


def make_exchange(name: str, durable: bool = False) -> Exchange:
    """The direct exchange all messages of one deployment go through."""
    return Exchange(name, type="direct", durable=durable, auto_delete=False)


def make_queue(
    name: str,
    exchange: Exchange,
    routing_keys: Sequence[str],
    auto_delete: bool = False,
    durable: bool = False,
    queue_type: str = CLASSIC,
    outlives_connection: bool = False,
) -> Queue:
    """A queue bound to ``exchange`` with each of ``routing_keys``.

    ``queue_type`` counts only with ``durable`` (BrokerSettings checks that
    quorum comes with it). ``outlives_connection`` counts only with
    ``auto_delete`` on a transient queue: it expires after
    ``RECONNECT_GRACE_S`` without consumers instead (callers ask for it on
    RabbitMQ only; kombu's virtual transports ignore both).
    """
    bindings = [binding(exchange, routing_key=key) for key in routing_keys]
    arguments: dict[str, Any] = queue_type_arguments(durable, queue_type)
    if durable and auto_delete:
        # Durable and auto-deleted would be gone after the restart it was
        # meant to survive: durable, with an idle expiry instead.
        auto_delete = False
        arguments["x-expires"] = int(IDLE_QUEUE_EXPIRES_S * 1000)
    elif auto_delete and outlives_connection:
        auto_delete = False
        arguments["x-expires"] = int(RECONNECT_GRACE_S * 1000)
    return Queue(
        name,
        exchange=exchange,
        bindings=bindings,
        durable=durable,
        auto_delete=auto_delete,
        queue_arguments=arguments or None,
    )


def queue_type_arguments(durable: bool, queue_type: str) -> dict[str, Any]:
    """The declaration arguments that make a durable queue of ``queue_type`` (a new dict).

    None for a classic queue: the arguments stay what they were before
    quorum queues existed, so a classic deployment declares exactly as before.
    """
    if durable and queue_type == QUORUM:
        return {"x-queue-type": QUORUM}
    return {}


def declare_without_waiting(queue: Queue) -> None:
    """Declare ``queue`` (bound to a channel), its exchanges and bindings; wait for no answer.

    As ``Queue.declare``, with AMQP's ``nowait`` on every step (kombu's own
    ``declare(nowait=True)`` still waits for each binding's exchange). The
    broker handles a channel's methods in order and closes the channel on
    the first it refuses: the caller's next method that has an answer
    (``basic_consume``) raises that refusal, or vouches for them all. The
    other transports answer at once anyway.
    """
    if getattr(queue, "no_declare", False):  # an attribute kombu's stubs omit
        return
    channel = queue.channel
    if queue.exchange is not None:
        queue.exchange.declare(nowait=True, channel=channel)
    queue.queue_declare(nowait=True, passive=False)
    if queue.exchange is not None and queue.exchange.name:
        queue.queue_bind(nowait=True)
    for bound in queue.bindings:
        bound.declare(channel, nowait=True)
        bound.bind(queue, nowait=True)


def deletes_auto_delete_queues(conn: Connection) -> bool:
    """Whether the broker deletes an auto-delete queue, with what it holds, with its consumer.

    A real AMQP broker does; kombu's virtual transports (Redis, filesystem,
    memory) keep such queues until someone deletes them. No I/O.
    """
    return not isinstance(conn.transport, virtual.Transport)


def publish_properties(durable: bool) -> dict[str, Any]:
    """Extra publish() keyword arguments for the topology."""
    return {"delivery_mode": PERSISTENT_DELIVERY_MODE} if durable else {}
