"""What an executor's start and stop cost besides the broker's own work.

start() opens the publishing connection while the reply consumer connects;
stop() removes the reply queue itself only where nothing else already did.
"""

from __future__ import annotations

import socket

import pytest
import redis

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import reply_queue
from flowengine.engines.worker_based.messaging import compat, inventory
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import redis_consumers, topology
from tests import waiting
from tests.worker_based.executor_helpers import running_executor, unique


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize(
    "url, durable, outlives, deleted, expected",
    [
        # RabbitMQ deletes an auto-delete queue when its consumer goes
        ("amqp://guest:guest@127.0.0.1:1//", False, False, False, False),
        # a durable reply queue is not auto-delete: it expires, or we delete it
        ("amqp://guest:guest@127.0.0.1:1//", True, False, False, True),
        # nor is one that outlives its connection, unless its stop deleted it
        ("amqp://guest:guest@127.0.0.1:1//", False, True, False, True),
        ("amqp://guest:guest@127.0.0.1:1//", False, True, True, False),
        # kombu's virtual transports ignore auto-delete
        ("memory://", False, False, False, True),
        ("redis://127.0.0.1:1/0", False, False, False, True),
        # unless the consumer's retired lease took its private queues with it
        ("redis://127.0.0.1:1/0", False, False, True, False),
    ],
)
def test_which_reply_queues_are_left_to_remove(url, durable, outlives, deleted, expected):
    broker = BrokerSettings(url, durable=durable)
    # told by the connection the caller has (a proxy's template: never connected)
    template = px.Proxy("t", unique(), broker=broker).template_connection
    assert inventory.needs_dropping(broker, deleted, template, outlives) is expected
    assert not template.connected


@pytest.mark.broker
def test_a_stopped_executor_on_redis_has_its_reply_queue_deleted_with_its_lease(redis_url):
    exchange = unique()
    client = redis.Redis.from_url(redis_url)
    with running_executor(exchange, ["t"], url=redis_url) as executor:
        queue = pr.reply_queue_name(exchange, executor.uuid)
        assert not executor.proxy.private_queues_deleted
        # (once its lease was first taken: before that there is nothing to retire,
        # and stop() deletes the queue itself, as a loaded machine showed)
        holder = executor.proxy._consumer._lease.consumer_id
        waiting.wait_until(
            lambda: client.hexists(redis_consumers.REGISTRY_KEY, holder),
            "the executor's consumer lease",
        )
    # Then the lease's retirement deleted it (so stop() did not have to)
    assert executor.proxy.private_queues_deleted
    assert not client.exists(queue)
    members = client.smembers(f"_kombu.binding.{exchange}")
    assert not any(m.decode().endswith(queue) for m in members)
    client.close()


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_connecting_the_publisher_early_never_raises():
    # Given a broker nobody listens on, Then connecting early is quiet
    proxy = px.Proxy(
        "t",
        unique(),
        broker=BrokerSettings(f"redis://127.0.0.1:{_dead_port()}/0"),
        options=px.ProxyOptions(publish_timeout_s=0.3),
    )
    proxy.connect_publisher()


def test_a_publisher_connected_early_publishes_on_that_connection():
    proxy = px.Proxy("t", unique(), broker=BrokerSettings(transport="memory"))
    proxy.connect_publisher()
    publishing = proxy._publisher._pub_conn
    assert publishing is not None and publishing.connected
    proxy.publish(pr.Notify(), "t")
    assert proxy._publisher._pub_conn is publishing


@pytest.mark.parametrize("transport", ["memory", "filesystem"])
def test_a_stopped_consumer_deletes_its_reply_queue_itself(transport, tmp_path, monkeypatch):
    # kombu's virtual transports ignore auto-delete. The consume loop's own
    # channels delete the reply queue as it stops (memory: queue_delete on
    # them; filesystem: closing the channel that marked it private), so
    # stop() need not connect again to declare and delete it.
    dropped_by_stop: list[str] = []
    monkeypatch.setattr(
        reply_queue,
        "drop_reply_queue",
        lambda broker, exchange, uuid, **_: dropped_by_stop.append(uuid),
    )
    options = {"data_folder": str(tmp_path)} if transport == "filesystem" else {}
    conn = {"transport": transport, "transport_options": options}
    exchange = unique()
    with running_executor(exchange, ["t"], **conn) as executor:
        queue = pr.reply_queue_name(exchange, executor.uuid)
        assert _exists(BrokerSettings(**conn), exchange, queue)
        assert not executor.proxy.private_queues_deleted
    assert executor.proxy.private_queues_deleted
    assert dropped_by_stop == []
    assert not _exists(BrokerSettings(**conn), exchange, queue)


def _exists(broker: BrokerSettings, exchange: str, queue: str) -> bool:
    """Whether ``queue`` is bound to ``exchange`` (a virtual transport's exchange table)."""
    with broker.connection() as conn:
        try:
            table = conn.default_channel.get_table(exchange)
        except Exception:  # no table: the exchange has no bindings left
            return False
    return any(bound == queue for _key, _pattern, bound in table)


def test_drop_queue_unbinds_a_memory_queue():
    # kombu's queue_delete leaves the memory transport's exchange table as it
    # was: announcements would go on filling a deleted reply queue.
    broker, exchange, queue = BrokerSettings(transport="memory"), unique(), unique("q")
    keys = ("k1", pr.ANNOUNCE_ROUTING_KEY)
    with broker.connection() as conn:
        declared = topology.make_queue(
            queue, compat.make_exchange(exchange), keys, auto_delete=True
        )
        declared(conn.default_channel).declare()
    assert _exists(broker, exchange, queue)
    inventory.drop_queue(broker, exchange, queue, keys, auto_delete=True)
    assert not _exists(broker, exchange, queue)
    with broker.connection() as conn:  # and drop_queue's purge did not make it again
        assert queue not in conn.default_channel.queues
