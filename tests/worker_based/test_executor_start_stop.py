"""What an executor's start and stop cost besides the broker's own work.

start() opens the publishing connection while the reply consumer connects;
stop() removes the reply queue itself only where nothing else already did.
"""

from __future__ import annotations

import socket

import pytest
import redis

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import inventory
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from tests.worker_based.executor_helpers import running_executor, unique


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("url, durable, deleted, expected", [
    # RabbitMQ deletes an auto-delete queue when its consumer goes
    ("amqp://guest:guest@127.0.0.1:1//", False, False, False),
    # a durable reply queue is not auto-delete: it expires, or we delete it
    ("amqp://guest:guest@127.0.0.1:1//", True, False, True),
    # kombu's virtual transports ignore auto-delete
    ("memory://", False, False, True),
    ("redis://127.0.0.1:1/0", False, False, True),
    # unless the consumer's retired lease took its private queues with it
    ("redis://127.0.0.1:1/0", False, True, False),
])
def test_which_reply_queues_are_left_to_remove(url, durable, deleted, expected):
    broker = BrokerSettings(url, durable=durable)
    assert inventory.needs_dropping(broker, deleted) is expected
    # the same from a connection the caller has (a proxy's template)
    template = px.Proxy("t", unique(), broker=broker).template_connection
    assert not template.connected
    assert inventory.needs_dropping(broker, deleted, template) is expected


@pytest.mark.broker
def test_a_stopped_executor_on_redis_has_its_reply_queue_deleted_with_its_lease(redis_url):
    exchange = unique()
    client = redis.Redis.from_url(redis_url)
    with running_executor(exchange, ["t"], url=redis_url) as executor:
        queue = pr.reply_queue_name(exchange, executor.uuid)
        assert not executor.proxy.private_queues_deleted
    # Then the lease's retirement deleted it (so stop() did not have to)
    assert executor.proxy.private_queues_deleted
    assert not client.exists(queue)
    members = client.smembers(f"_kombu.binding.{exchange}")
    assert not any(m.decode().endswith(queue) for m in members)
    client.close()


def test_connecting_the_publisher_early_never_raises():
    # Given a broker nobody listens on, Then connecting early is quiet
    proxy = px.Proxy("t", unique(), url=f"redis://127.0.0.1:{_dead_port()}/0",
                     publish_timeout_s=0.3)
    proxy.connect_publisher()


def test_a_publisher_connected_early_publishes_on_that_connection():
    proxy = px.Proxy("t", unique(), transport="memory")
    proxy.connect_publisher()
    publishing = proxy._publisher._pub_conn
    assert publishing is not None and publishing.connected
    proxy.publish(pr.Notify(), "t")
    assert proxy._publisher._pub_conn is publishing
