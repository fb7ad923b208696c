"""Removing an executor's reply queue from the broker once nobody consumes it."""

from __future__ import annotations

import logging

from kombu.transport import virtual

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import compat
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import topology

LOG = logging.getLogger(__name__)


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
    # Declared as the executor's proxy declares them (a durable mismatch would fail).
    exchange = compat.make_exchange(exchange_name, durable=broker.durable,
                                    compat=broker.compat)
    keys = (executor_uuid, pr.ANNOUNCE_ROUTING_KEY)
    queue = topology.make_queue(pr.reply_queue_name(exchange_name, executor_uuid), exchange,
                                keys, auto_delete=True, durable=broker.durable)
    try:
        with broker.connection() as conn:
            conn.ensure_connection(max_retries=1)
            bound = queue(conn.default_channel)
            # Declared again so this connection knows the bindings to remove.
            bound.declare()
            bound.delete()
            if isinstance(conn.default_channel, virtual.Channel):
                bound.purge()
    except Exception:
        LOG.debug("Could not remove reply queue of executor %s", executor_uuid,
                  exc_info=True)
