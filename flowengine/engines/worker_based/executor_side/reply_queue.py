"""Removing an executor's reply queue from the broker once nobody consumes it."""

from __future__ import annotations

from kombu.transport import virtual

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import inventory
from flowengine.engines.worker_based.messaging.settings import BrokerSettings


def needs_dropping(broker: BrokerSettings, deleted_with_lease: bool) -> bool:
    """Whether a stopped executor's reply queue is still there to remove.

    Not on AMQP (unless durable): RabbitMQ deletes an auto-delete queue when
    its consumer goes. Not when the consumer's lease was retired (Redis): that
    deleted its private queues with their bindings. Saves the stop of a short
    engine run a connection and a few round trips.
    """
    if deleted_with_lease:
        return False
    if broker.durable:
        return True  # durable queues are not auto-delete (topology.make_queue)
    conn = broker.connection()  # not connected: no I/O
    try:
        return isinstance(conn.transport, virtual.Transport)
    finally:
        conn.release()


def drop_reply_queue(broker: BrokerSettings, exchange_name: str, executor_uuid: str) -> None:
    """Unbind and empty the reply queue of executor ``executor_uuid``; never raises.

    kombu's virtual transports (filesystem, redis, memory) ignore
    auto_delete: left bound, the queue would collect every worker's
    announcements forever (one more dead queue per engine run). A broker
    that cannot be reached is logged at DEBUG and left as it is.
    """
    inventory.drop_queue(broker, exchange_name,
                         pr.reply_queue_name(exchange_name, executor_uuid),
                         (executor_uuid, pr.ANNOUNCE_ROUTING_KEY), auto_delete=True)
