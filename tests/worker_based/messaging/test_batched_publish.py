"""Publishing several messages at once, and Redis routing a publication itself.

The executor queues the requests the engine submits and its sender thread
publishes what is queued as one batch (Publisher.send); on flowengine's
Redis transport a batch, like a single publication to a direct exchange, is
one script call that looks the bindings up and pushes, atomically.
"""

from __future__ import annotations

import threading
from typing import Any

import kombu
import pytest
import redis

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import publisher as request_publisher
from flowengine.engines.worker_based.messaging.publisher import BatchNotSent, Publisher
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import topology
from flowengine.types import failure as ft
from tests.worker_based import executor_tasks as et
from tests.worker_based import redis_stats
from tests.worker_based.executor_helpers import (
    WAIT_S,
    FakeWorker,
    running_executor,
    unique,
    wait_workers,
)

ECHO = "tests.worker_based.executor_tasks.Echo"

#: Messages per batch in these tests: more than one, fewer than a sender's cap.
BATCH = 20


def _settings(broker: Any) -> BrokerSettings:
    return BrokerSettings(broker.url, transport_options=broker.transport_options)


def _bound_queue(
    conn: kombu.Connection, exchange: kombu.Exchange, name: str, key: str
) -> kombu.Queue:
    queue = kombu.Queue(name, exchange, routing_key=key, durable=False)
    queue(conn.default_channel).declare()
    return queue


def _drain(conn: kombu.Connection, queue: kombu.Queue, count: int) -> list[Any]:
    """The bodies of the next ``count`` messages of ``queue``, as consumed."""
    got: list[Any] = []
    done = threading.Event()

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        message.ack()
        if len(got) >= count:
            done.set()

    with kombu.Consumer(conn.default_channel, [queue], callbacks=[on_message], accept=["json"]):
        while not done.is_set():
            conn.drain_events(timeout=WAIT_S)
    return got


# --- Publisher.send, on every broker ---


def test_a_batch_arrives_in_order_on_every_broker(broker):
    # Given a queue bound to an exchange
    exchange = topology.make_exchange(unique())
    settings = _settings(broker)
    publisher = Publisher(settings, exchange)
    with settings.connection() as conn:
        queue = _bound_queue(conn, exchange, unique("q"), "k")
        # When a batch is sent
        batch = [publisher.prepare("T", {"n": n}, "k", correlation_id=str(n)) for n in range(BATCH)]
        publisher.send(batch)
        # Then every message arrives, in order
        assert _drain(conn, queue, BATCH) == [{"n": n} for n in range(BATCH)]
    publisher.close_if_idle()


def test_an_empty_batch_sends_nothing():
    Publisher(BrokerSettings("memory://"), topology.make_exchange(unique())).send([])


@pytest.mark.broker
def test_a_batch_that_cannot_go_out_says_how_much_did(private_redis):
    # Given a broker that is gone
    publisher = Publisher(
        BrokerSettings(private_redis.url), topology.make_exchange(unique()), timeout_s=0.3
    )
    private_redis.kill()
    batch = [publisher.prepare("T", {"n": n}, "k") for n in range(3)]
    # When sending a batch, Then it fails naming what failed and how much went out
    with pytest.raises(BatchNotSent) as caught:
        publisher.send(batch)
    assert caught.value.sent == 0
    assert isinstance(caught.value.cause, exc.PublishTimeout)


# --- Redis: routing on the server, one script call ---


@pytest.mark.broker
def test_redis_routes_a_publication_to_every_queue_bound_with_its_key(private_redis):
    exchange = topology.make_exchange(unique())
    client = redis.Redis.from_url(private_redis.url)
    with kombu.Connection(private_redis.url, transport=topology_transport()) as conn:
        # Given two queues bound with the key, one with another key
        first = _bound_queue(conn, exchange, unique("a"), "k")
        second = _bound_queue(conn, exchange, unique("b"), "k")
        other = _bound_queue(conn, exchange, unique("c"), "other")
        producer = kombu.Producer(conn.default_channel, exchange=exchange)
        producer.publish({"n": 0}, routing_key="k")  # the first call also loads the script
        scripts = redis_stats.command_calls(client, "evalsha")
        # When publishing once
        producer.publish({"n": 1}, routing_key="k")
        # Then one script call looked the bindings up and pushed to both queues
        assert redis_stats.command_calls(client, "evalsha") == scripts + 1
        assert client.llen(first.name) == client.llen(second.name) == 2
        assert client.llen(other.name) == 0
    # and kombu's own Redis transport reads them as its own
    with kombu.Connection(private_redis.url) as plain:
        assert _drain(plain, first, 2) == [{"n": 0}, {"n": 1}]
    client.close()


@pytest.mark.broker
def test_redis_drops_a_publication_nobody_is_bound_for(private_redis):
    exchange = topology.make_exchange(unique())
    client = redis.Redis.from_url(private_redis.url)
    with kombu.Connection(private_redis.url, transport=topology_transport()) as conn:
        # Given a queue that was deleted (its binding with it)
        queue = _bound_queue(conn, exchange, unique("a"), "k")
        queue(conn.default_channel).delete()
        # When publishing with its key, Then nothing is pushed (kombu drops it too):
        # no list is left behind under the deleted queue's name
        kombu.Producer(conn.default_channel, exchange=exchange).publish({"n": 1}, routing_key="k")
        assert not client.exists(queue.name)
    client.close()


@pytest.mark.broker
def test_a_redis_batch_is_one_script_call(private_redis):
    exchange = topology.make_exchange(unique())
    publisher = Publisher(BrokerSettings(private_redis.url), exchange)
    client = redis.Redis.from_url(private_redis.url)
    with kombu.Connection(private_redis.url) as conn:
        queue = _bound_queue(conn, exchange, unique("q"), "k")
        publisher.send([publisher.prepare("T", {"n": -1}, "k")])  # connects, loads the script
        scripts = redis_stats.command_calls(client, "evalsha")
        # When a batch is sent
        publisher.send([publisher.prepare("T", {"n": n}, "k") for n in range(BATCH)])
        # Then it took one script call, and the messages are queued in order
        assert redis_stats.command_calls(client, "evalsha") == scripts + 1
        assert _drain(conn, queue, BATCH + 1) == [{"n": n} for n in range(-1, BATCH)]
    publisher.close_if_idle()
    client.close()


@pytest.mark.broker
def test_a_redis_publisher_holds_one_connection(private_redis):
    # kombu opens a Redis channel with a PING through the pool consuming
    # reads from, and publishes through another pool: a publisher, which
    # never consumes, would hold two connections. Ours publishes through the
    # one its channel opened with.
    exchange = topology.make_exchange(unique())
    client = redis.Redis.from_url(private_redis.url)
    with kombu.Connection(private_redis.url) as conn:
        queue = _bound_queue(conn, exchange, unique("q"), "k")
        opened = redis_stats.connections_received(client)  # this server is the test's own
        # When a publisher connects and sends a message, then a batch
        publisher = Publisher(BrokerSettings(private_redis.url), exchange)
        publisher.connect()
        publisher.send([publisher.prepare("T", {"n": 0}, "k")])
        publisher.send([publisher.prepare("T", {"n": n}, "k") for n in range(1, 3)])
        # Then the server saw one more connection, and the messages arrived
        assert redis_stats.connections_received(client) == opened + 1
        publisher.close_if_idle()
        assert _drain(conn, queue, 3) == [{"n": n} for n in range(3)]
    client.close()


@pytest.mark.broker
def test_a_redis_batch_whose_block_raises_pushes_nothing(private_redis):
    exchange = topology.make_exchange(unique())
    client = redis.Redis.from_url(private_redis.url)
    with kombu.Connection(private_redis.url, transport=topology_transport()) as conn:
        queue = _bound_queue(conn, exchange, unique("q"), "k")
        producer = kombu.Producer(conn.default_channel, exchange=exchange)
        with pytest.raises(RuntimeError, match="midway"):
            with conn.default_channel.batching():
                producer.publish({"n": 1}, routing_key="k")
                raise RuntimeError("midway")
        assert client.llen(queue.name) == 0
    client.close()


def topology_transport() -> str:
    """flowengine's Redis transport, as flowengine's proxies pick it for redis:// URLs."""
    return "flowengine.engines.worker_based.transports.redis:Transport"


# --- the executor: requests submitted together ---


def _auto_success(fake: FakeWorker, data: dict, message: Any) -> None:
    fake.reply(message, pr.RUNNING)
    fake.reply(message, pr.SUCCESS, result=data["arguments"]["value"])


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.broker)])
def test_requests_submitted_together_reach_the_worker_in_order_and_complete(kind, request):
    conn = (
        {"transport": "memory"}
        if kind == "memory"
        else {"url": request.getfixturevalue("redis_url")}
    )
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO], on_request=_auto_success, **conn) as fake,
        running_executor(exchange, ["t"], **conn) as executor,
    ):
        assert wait_workers(executor, lambda f: f.total_workers >= 1)
        # When many requests are submitted in one go (as the engine schedules)
        futures = [
            executor.execute_task(et.Echo(f"e{n}"), f"u-{n}", {"value": n})
            for n in range(BATCH * 3)
        ]
        # Then each completes with its own result
        assert [f.result(WAIT_S) for f in futures] == [(base.EXECUTED, n) for n in range(BATCH * 3)]
    # and the worker got them in the order they were submitted
    assert [data["arguments"]["value"] for data, _ in fake.requests] == list(range(BATCH * 3))


def test_an_unencodable_request_fails_alone_and_its_batch_goes_out():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO], on_request=_auto_success) as fake,
        running_executor(exchange, ["t"]) as executor,
    ):
        assert wait_workers(executor, lambda f: f.total_workers >= 1)
        values: list[Any] = [0, object(), 2]
        futures = [
            executor.execute_task(et.Echo(f"e{n}"), f"u-{n}", {"value": v})
            for n, v in enumerate(values)
        ]
        results = [f.result(WAIT_S) for f in futures]
    assert results[0] == (base.EXECUTED, 0) and results[2] == (base.EXECUTED, 2)
    assert isinstance(results[1][1], ft.Failure)
    assert results[1][1].check(exc.SerializationFailure)
    assert [data["arguments"]["value"] for data, _ in fake.requests] == [0, 2]


def _recording_sends(executor: Any, monkeypatch: Any) -> list[tuple[str, int]]:
    """(thread name, batch size) of every send() of the executor's proxy from now on."""
    senders: list[tuple[str, int]] = []
    send = executor.proxy.send

    def recording_send(batch: Any, *args: Any) -> None:
        senders.append((threading.current_thread().name, len(batch)))
        send(batch, *args)

    monkeypatch.setattr(executor.proxy, "send", recording_send)
    return senders


def _burst(executor: Any, first: int) -> None:
    futures = [
        executor.execute_task(et.Echo(f"e{n}"), f"u-{n}", {"value": n})
        for n in range(first, first + BATCH)
    ]
    assert [f.result(WAIT_S)[1] for f in futures] == list(range(first, first + BATCH))


@pytest.mark.broker
def test_on_redis_a_request_alone_is_published_by_submit_and_a_burst_by_the_sender(
    redis_url, monkeypatch
):
    exchange = unique()
    conn = {"url": redis_url}
    with (
        FakeWorker(exchange, "t", [ECHO], on_request=_auto_success, **conn),
        running_executor(exchange, ["t"], **conn) as executor,
    ):
        assert executor.proxy.batches_publications
        assert wait_workers(executor, lambda f: f.total_workers >= 1)
        senders = _recording_sends(executor, monkeypatch)
        # When one request is submitted on its own (no submit just before it)
        monkeypatch.setattr(request_publisher, "BURST_GAP_S", 0.0)
        executor.execute_task(et.Echo("e"), "u-0", {"value": 0}).result(WAIT_S)
        # Then the submitting thread itself published it
        assert senders == [(threading.current_thread().name, 1)]
        # When requests come in a burst (each right after the one before)
        monkeypatch.setattr(request_publisher, "BURST_GAP_S", 3600.0)
        _burst(executor, 1)
    # Then the sender thread published them all (in as many batches as it woke)
    burst = senders[1:]
    assert all(name.startswith("flowengine-sender-") for name, _ in burst)
    assert sum(n for _, n in burst) == BATCH


def test_where_a_batch_saves_nothing_submit_publishes_every_request_itself(monkeypatch):
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO], on_request=_auto_success),
        running_executor(exchange, ["t"]) as executor,
    ):
        assert not executor.proxy.batches_publications  # the memory transport
        assert wait_workers(executor, lambda f: f.total_workers >= 1)
        senders = _recording_sends(executor, monkeypatch)
        monkeypatch.setattr(request_publisher, "BURST_GAP_S", 3600.0)
        _burst(executor, 0)
    assert senders == [(threading.current_thread().name, 1)] * BATCH
