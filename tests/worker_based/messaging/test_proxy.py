"""Proxy: publish/consume, declare once, supervised loop, prompt stop, no secrets."""

from __future__ import annotations

import logging
import threading
import time

import amqp
import kombu
import pytest
from wire_helpers import RawSender, as_broker, conn_kwargs

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import consumer, dispatcher
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings

WAIT_S = 10.0

#: A consume loop's own period of checking for stop() in test_stop_is_prompt:
#: far beyond WAIT_S, so only the wake-up message can end the loop in time.
STOP_CHECK_S = 60.0


class Body(pr.Message):
    """A REQUEST-typed message with an arbitrary body."""

    TYPE = pr.REQUEST

    def __init__(self, data):
        self.data = data

    def to_dict(self):
        return self.data


class Recorder:
    """Collects (data, properties, headers) of delivered messages; waits on counts."""

    def __init__(self):
        self.items = []
        self.cond = threading.Condition()

    def __call__(self, data, message):
        with self.cond:
            self.items.append((data, dict(message.properties), dict(message.headers or {})))
            self.cond.notify_all()

    def wait_count(self, n, timeout=WAIT_S):
        with self.cond:
            return self.cond.wait_for(lambda: len(self.items) >= n, timeout)


class Running:
    """A proxy consuming in a thread for the with-block."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.thread = threading.Thread(target=proxy.start, daemon=True)

    def __enter__(self):
        self.thread.start()
        assert self.proxy.wait(WAIT_S)
        return self.proxy

    def __exit__(self, *exc_info):
        self.proxy.stop()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()


def _proxy(broker, unique_name, handler, topic="t", **kwargs):
    return px.Proxy(
        topic,
        unique_name,
        {pr.REQUEST: dispatcher.Handler(handler)},
        **as_broker(conn_kwargs(broker)),
        options=px.ProxyOptions(**kwargs),
    )


def test_publish_and_consume(broker, unique_name):
    rec = Recorder()
    with Running(_proxy(broker, unique_name, rec)) as proxy:
        assert proxy.is_running
        proxy.publish(
            Body({"n": 1}), "t", reply_to="r", correlation_id="c", headers={pr.HEADER_ATTEMPT: 2}
        )
        assert rec.wait_count(1)
    data, props, headers = rec.items[0]
    assert data == {"n": 1}
    assert (props["type"], props["reply_to"], props["correlation_id"]) == ("REQUEST", "r", "c")
    assert headers[pr.HEADER_ATTEMPT] == 2
    assert not proxy.is_running


def test_extra_bindings_and_several_routing_keys(broker, unique_name):
    rec = Recorder()
    with Running(_proxy(broker, unique_name, rec, bindings=[pr.ANNOUNCE_ROUTING_KEY])) as p:
        p.publish(Body({"to": "both"}), ["t", pr.ANNOUNCE_ROUTING_KEY])
        assert rec.wait_count(2)
    assert [d for d, _p, _h in rec.items] == [{"to": "both"}] * 2


def test_explicit_queues(broker, unique_name):
    rec = Recorder()
    queues = [
        px.QueueSpec(f"{unique_name}_a", ("a",)),
        px.QueueSpec(f"{unique_name}_b", ("b", "c"), auto_delete=True),
    ]
    proxy = _proxy(broker, unique_name, rec, queues=queues, wake_routing_key="b")
    assert proxy.queues == queues
    with Running(proxy):
        for key in ("a", "b", "c"):
            proxy.publish(Body({"key": key}), key)
        assert rec.wait_count(3)
    assert sorted(d["key"] for d, _p, _h in rec.items) == ["a", "b", "c"]


@pytest.mark.parametrize("broker", ["amqp"], indirect=True)
def test_declarations_wait_for_no_answer_but_the_consumers(broker, unique_name, monkeypatch):
    # RabbitMQ answers a channel's methods in order: basic_consume's answer
    # vouches for the exchange, queue and bindings declared before it without
    # waiting (two round trips to start consuming instead of eight).
    waited_for = []
    real_wait = amqp.abstract_channel.AbstractChannel.wait

    def wait(channel, method, *args, **kwargs):
        waited_for.append(method)
        return real_wait(channel, method, *args, **kwargs)

    monkeypatch.setattr(amqp.abstract_channel.AbstractChannel, "wait", wait)
    rec = Recorder()
    queues = [px.QueueSpec(f"{unique_name}_a", ("a", "b"), auto_delete=True)]
    proxy = _proxy(broker, unique_name, rec, queues=queues, wake_routing_key="a")
    with Running(proxy):
        started = list(waited_for)
        for key in ("a", "b"):
            proxy.publish(Body({"key": key}), key)
        assert rec.wait_count(2)
    declared = {amqp.spec.Exchange.DeclareOk, amqp.spec.Queue.DeclareOk, amqp.spec.Queue.BindOk}
    assert not declared & {m for m in started if isinstance(m, tuple)}
    assert amqp.spec.Basic.ConsumeOk in started
    assert sorted(d["key"] for d, _p, _h in rec.items) == ["a", "b"]


def test_concurrent_publishers_all_arrive(broker, unique_name):
    rec = Recorder()
    with Running(_proxy(broker, unique_name, rec)) as proxy:

        def burst(k):
            for i in range(50):
                proxy.publish(Body({"k": k, "i": i}), "t")

        threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert rec.wait_count(200)
    for k in range(4):  # each publisher's messages stay in its order
        mine = [d["i"] for d, _p, _h in rec.items if d["k"] == k]
        assert mine == list(range(50))


def test_handler_publishing_from_the_consumer_thread(broker, unique_name):
    # A reply published from inside a handler goes through the separate
    # publisher connection (py-amqp would recurse if it reused the consumer's).
    rec = Recorder()
    replies = px.Proxy(
        "replies",
        unique_name,
        {pr.RESPONSE: dispatcher.Handler(rec)},
        **as_broker(conn_kwargs(broker)),
    )

    def echo(data, message):
        proxy.publish(
            pr.Response(pr.SUCCESS, result=data["i"]), "replies", correlation_id=str(data["i"])
        )

    proxy = _proxy(broker, unique_name, echo)
    with Running(replies), Running(proxy):
        for i in range(100):
            proxy.publish(Body({"i": i}), "t")
        assert rec.wait_count(100)
    assert [d["data"]["result"] for d, _p, _h in rec.items] == list(range(100))


def test_declares_once_and_keeps_one_producer(unique_name, monkeypatch):
    made, declared = [], []
    real_init = kombu.Producer.__init__
    real_declare = kombu.Exchange.declare

    def counting_init(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)

    def counting_declare(self, *args, **kwargs):
        declared.append(self.name)
        return real_declare(self, *args, **kwargs)

    monkeypatch.setattr(kombu.Producer, "__init__", counting_init)
    monkeypatch.setattr(kombu.Exchange, "declare", counting_declare)
    proxy = px.Proxy("t", unique_name, broker=BrokerSettings(transport="memory"))
    proxy.publish(Body({}), "t")
    first_made, first_declared = len(made), len(declared)
    for _ in range(100):
        proxy.publish(Body({}), "t")
    assert len(made) == first_made == 1
    assert len(declared) == first_declared <= 1


def test_unencodable_body_is_a_serialization_failure(unique_name):
    proxy = px.Proxy("t", unique_name, broker=BrokerSettings(transport="memory"))
    with pytest.raises(exc.SerializationFailure, match="not JSON serializable"):
        proxy.publish(Body({"x": object()}), "t")


def test_oversized_body_is_refused_before_sending(unique_name):
    proxy = px.Proxy(
        "t",
        unique_name,
        broker=BrokerSettings(transport="memory"),
        options=px.ProxyOptions(consume=px.ConsumeOptions(max_body_bytes=100)),
    )
    proxy.publish(Body({"small": "x" * 10}), "t")
    with pytest.raises(exc.SerializationFailure, match="exceeds the limit of 100 bytes"):
        proxy.publish(Body({"big": "x" * 200}), "t")


def test_malformed_messages_do_not_stop_the_loop(broker, unique_name, caplog):
    rec = Recorder()
    rejected = []
    proxy = _proxy(
        broker,
        unique_name,
        rec,
        on_reject=lambda m, r: rejected.append(r),
        consume=px.ConsumeOptions(max_body_bytes=1000),
    )
    sender = RawSender(unique_name, **conn_kwargs(broker))
    try:
        with Running(proxy):
            sender.send("{not json", "t", type="REQUEST")
            sender.send(
                b"\x80\x04pickle",
                "t",
                content_type="application/x-python-serialize",
                type="REQUEST",
            )
            sender.send('{"big": "' + "z" * 2000 + '"}', "t", type="REQUEST")
            sender.send('{"fine": true}', "t", type="REQUEST")
            assert rec.wait_count(1)
    finally:
        sender.close()
    assert [d for d, _p, _h in rec.items] == [{"fine": True}]
    assert len(rejected) == 3
    assert "undecodable body" in rejected[0]
    assert "undecodable body" in rejected[1] and "pickle" in rejected[1]
    assert "exceeds the limit of 1000 bytes" in rejected[2]


def test_handler_crash_is_survived(broker, unique_name, caplog):
    rec = Recorder()

    def handler(data, message):
        if data.get("crash"):
            raise RuntimeError("handler exploded")
        rec(data, message)

    with Running(_proxy(broker, unique_name, handler)) as proxy:
        proxy.publish(Body({"crash": True}), "t")
        proxy.publish(Body({"crash": False}), "t")
        assert rec.wait_count(1)
    assert "handler exploded" in caplog.text


def test_connection_error_is_survived_by_reconnecting(unique_name, monkeypatch, caplog):
    # Given a consume loop whose connection breaks once while draining,
    monkeypatch.setattr(consumer, "RECONNECT_BACKOFF_S", 0.01)
    rec = Recorder()
    starts = []

    class CountStarts(px.LoopObserver):
        def after_consume_start(self):
            starts.append(threading.get_ident())

    proxy = px.Proxy(
        "t",
        unique_name,
        {pr.REQUEST: dispatcher.Handler(rec)},
        broker=BrokerSettings(transport="memory"),
        options=px.ProxyOptions(observer=CountStarts()),
    )
    from flowengine.engines.worker_based.transports import memory as mem

    real_drain = mem.Transport.drain_events
    broken = threading.Event()

    def flaky_drain(self, connection, timeout=None):
        # Only this proxy's loop (its thread told its start before draining):
        # another test's loop still ending in this process drains too.
        if not broken.is_set() and threading.get_ident() in starts:
            broken.set()
            raise ConnectionResetError("broker went away")
        return real_drain(self, connection, timeout=timeout)

    monkeypatch.setattr(mem.Transport, "drain_events", flaky_drain)
    with caplog.at_level(logging.ERROR), Running(proxy):
        assert broken.wait(WAIT_S)
        # When a message is published after the break,
        proxy.publish(Body({"after": "reconnect"}), "t")
        # Then it is still consumed (the loop reconnected and re-consumed).
        assert rec.wait_count(1)
    assert len(starts) >= 2
    assert "lost" in caplog.text and "broker went away" in caplog.text


def test_on_wait_runs_while_idle(unique_name):
    calls = threading.Event()
    proxy = px.Proxy(
        "t",
        unique_name,
        on_wait=calls.set,
        broker=BrokerSettings(transport="memory"),
        options=px.ProxyOptions(consume=px.ConsumeOptions(wait_period_s=0.02)),
    )
    with Running(proxy):
        assert calls.wait(WAIT_S)


def test_failing_callbacks_are_contained(unique_name, caplog):
    ticks = []

    def on_wait():
        ticks.append(1)
        raise RuntimeError("on_wait exploded")

    proxy = px.Proxy(
        "t",
        unique_name,
        on_wait=on_wait,
        broker=BrokerSettings(transport="memory"),
        options=px.ProxyOptions(consume=px.ConsumeOptions(wait_period_s=0.01)),
    )
    with Running(proxy):
        deadline = time.monotonic() + WAIT_S
        while len(ticks) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.is_running
    assert len(ticks) >= 3 and "on_wait exploded" in caplog.text


def test_stop_is_prompt(broker, unique_name):
    # Given a loop that would look at stop() only once a minute on its own
    proxy = _proxy(
        broker, unique_name, Recorder(), consume=px.ConsumeOptions(wait_period_s=STOP_CHECK_S)
    )
    thread = threading.Thread(target=proxy.start, daemon=True)
    thread.start()
    assert proxy.wait(WAIT_S)
    # When it is stopped, Then it ends long before that: the wake-up message did it
    proxy.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_cannot_start_twice_at_once(unique_name):
    proxy = px.Proxy("t", unique_name, broker=BrokerSettings(transport="memory"))
    with Running(proxy):
        with pytest.raises(RuntimeError, match="already running"):
            proxy.start()


def test_can_restart_after_stop(unique_name):
    rec = Recorder()
    proxy = px.Proxy(
        "t",
        unique_name,
        {pr.REQUEST: dispatcher.Handler(rec)},
        broker=BrokerSettings(transport="memory"),
    )
    with Running(proxy):
        proxy.publish(Body({"round": 1}), "t")
        assert rec.wait_count(1)
    running = Running(proxy)
    running.thread = threading.Thread(target=proxy.start, daemon=True)
    with running:
        proxy.publish(Body({"round": 2}), "t")
        assert rec.wait_count(2)


def test_connection_details_never_show_the_password():
    proxy = px.Proxy(
        "t",
        "ex",
        broker=BrokerSettings(
            "amqp://user:s3cret@broker.invalid:5672//",
            transport_options={"sentinel_password": "s3cret", "region": "x"},
        ),
    )
    details = proxy.connection_details
    assert "s3cret" not in repr(details)
    assert details.uri.startswith("amqp://user:**@broker.invalid")
    assert details.transport.options == {"sentinel_password": "**", "region": "x"}
    assert details.transport.driver_type == "amqp"
    assert px.mask_options({"api_key": 1, "n": 2}) == {"api_key": "**", "n": 2}


def test_default_retry_options_and_properties():
    assert px.Proxy.DEFAULT_RETRY_OPTIONS == {
        "max_retries": 3,
        "interval_start": 1,
        "interval_step": 1,
        "interval_max": 1,
    }
    proxy = px.Proxy(
        "t", "ex", broker=BrokerSettings(transport="memory", retry_options={"max_retries": 1})
    )
    assert proxy.broker.retry_options == {"max_retries": 1}
    assert (proxy.topic, proxy.exchange) == ("t", "ex")
    assert isinstance(proxy.dispatcher, dispatcher.TypeDispatcher)
    assert proxy.queues == [px.QueueSpec("ex_t", ("t",), auto_delete=True)]
    assert not proxy.is_running and proxy.wait(0) is False


def test_broker_settings_and_loose_arguments_are_not_both_given():
    with pytest.raises(ValueError, match="not both"):
        px.Proxy("t", "ex", url="memory://", broker=BrokerSettings(transport="memory"))


def test_broker_settings_never_show_the_password():
    settings = BrokerSettings(
        "amqp://user:s3cret@broker.invalid:5672//", transport_options={"api_token": "s3cret"}
    )
    assert "s3cret" not in repr(settings)
    assert "amqp://user:**@broker.invalid" in repr(settings)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://broker.invalid:6379/0", "redis://broker.invalid:6379/0"),
        ("redis://:s3cret@broker.invalid:6379/0", "redis://:**@broker.invalid:6379/0"),
    ],
)
def test_a_url_without_a_password_is_shown_without_a_mask(url, shown):
    # kombu's own as_uri(include_password=False) gives redis://:**@host for
    # both: a user could not tell whether a password is configured.
    assert BrokerSettings(url).public_uri == shown


def test_a_handler_that_settles_its_message_is_not_acknowledged_again(unique_name):
    # Given a handler that gives every message back once, then takes it
    rec = Recorder()

    def handler(data, message):
        rec(data, message)
        if len(rec.items) == 1:
            message.requeue()

    proxy = px.Proxy(
        "t",
        unique_name,
        {pr.REQUEST: dispatcher.Handler(handler, settles=True)},
        broker=BrokerSettings(transport="memory"),
    )
    with Running(proxy):
        # When one message arrives
        proxy.publish(Body({"n": 1}), "t")
        # Then the consumer did not acknowledge the one given back: it came again
        assert rec.wait_count(2)
    assert [d for d, _p, _h in rec.items] == [{"n": 1}, {"n": 1}]


@pytest.mark.parametrize("batched,durable", [(True, False), (False, False), (True, True)])
def test_amqp_reply_queues_are_consumed_without_acknowledgements(
    amqp_url, unique_name, monkeypatch, batched, durable
):
    # Given a consumer of a queue private to it on RabbitMQ: batched (an
    # executor's reply queue, deleted with its consumer) or not, transient or
    # durable (which may outlive a broker restart)
    # (flowengine's amqp channel writes acknowledgements itself: count there)
    from flowengine.engines.worker_based.transports.amqp import Channel

    acks = []
    real_ack = Channel.basic_ack

    def counting_ack(channel, delivery_tag, *args, **kwargs):
        acks.append(delivery_tag)
        return real_ack(channel, delivery_tag, *args, **kwargs)

    monkeypatch.setattr(Channel, "basic_ack", counting_ack)
    rec = Recorder()
    queues = [
        px.QueueSpec(
            f"{unique_name}_replies", ("r",), auto_delete=True, private=True, batched=batched
        )
    ]
    proxy = px.Proxy(
        "r",
        unique_name,
        {pr.REQUEST: dispatcher.Handler(rec)},
        broker=BrokerSettings(url=amqp_url, durable=durable),
        options=px.ProxyOptions(queues=queues, wake_routing_key="r"),
    )
    with Running(proxy):
        # When messages arrive
        for n in range(5):
            proxy.publish(Body({"n": n}), "r")
        assert rec.wait_count(5)
    # Then every one was handled, and acknowledged unless batched and
    # transient: RabbitMQ deletes that queue with its consumer, so an
    # acknowledgement could not bring a message back to anybody (the others
    # also acknowledge the wake-up message stop() sends)
    assert [d["n"] for d, _p, _h in rec.items] == list(range(5))
    assert len(acks) == 0 if batched and not durable else len(acks) >= 5
