"""Removing an executor's reply queue from the broker once nobody consumes it."""

from __future__ import annotations

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import inventory
from flowengine.engines.worker_based.messaging.settings import BrokerSettings


def drop_reply_queue(
    broker: BrokerSettings,
    exchange_name: str,
    executor_uuid: str,
    outlives_connection: bool = False,
) -> None:
    """Unbind and empty the reply queue of executor ``executor_uuid``; never raises.

    kombu's virtual transports (filesystem, redis, memory) ignore
    auto_delete: left bound, the queue would collect every worker's
    announcements forever (one more dead queue per engine run); on
    RabbitMQ one that ``outlives_connection`` stays for a while after its
    consumer went (topology.RECONNECT_GRACE_S). A broker
    that cannot be reached is logged at DEBUG and left as it is.
    """
    inventory.drop_queue(
        broker,
        exchange_name,
        pr.reply_queue_name(exchange_name, executor_uuid),
        (executor_uuid, pr.ANNOUNCE_ROUTING_KEY),
        auto_delete=True,
        outlives_connection=outlives_connection,
    )
