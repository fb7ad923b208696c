"""Poison messages: refused once, dead-lettered with their reason, the loop goes on.

Issue 35: a message kombu could not build (a ``compression`` header over a
body not so compressed, headers that are not a mapping) made the consume
loop restart for ever, the message given back each time. Every broker kind.
"""

from __future__ import annotations

import json
import logging
import threading

import kombu
import pytest
import worker_tasks as wt
from wire_helpers import Client, RawSender, conn_kwargs, running_worker

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging import consumer as consumer_mod
from flowengine.engines.worker_based.messaging import dead_letters as dl
from flowengine.engines.worker_based.messaging.dispatcher import TypeDispatcher
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from tests import waiting

TOPIC = "calc"


def read_dead_letters(broker, exchange: str, queue: str) -> list[kombu.Message]:
    """Every message in dead-letter queue ``queue`` (taken: the queue ends empty)."""
    conn = kombu.Connection(
        broker.url,
        transport=transports.resolve(broker.url, None),
        transport_options=dict(broker.transport_options),
    )
    try:
        exchange_ = kombu.Exchange(exchange, type="direct", durable=False, auto_delete=False)
        bound = dl.declare_queue(conn.channel(), exchange_, queue, durable=False)
        taken = []
        while (message := bound.get(no_ack=True)) is not None:
            taken.append(message)
        return taken
    finally:
        conn.release()


def request_props(client: Client, cid: str) -> dict:
    return {"type": pr.REQUEST, "reply_to": client.uuid, "correlation_id": cid}


def test_dead_letter_queue_names():
    assert dl.dead_letter_queue_name("ex_calc", "ex", private=False) == "ex_calc.dead"
    assert dl.dead_letter_queue_name("ex_calc.w1", "ex", private=True) == "ex.dead"
    assert dl.is_dead_letter_queue("ex_calc.dead") and not dl.is_dead_letter_queue("ex_calc")


def test_broker_settings_check_the_limits():
    with pytest.raises(ValueError, match="max_redeliveries"):
        BrokerSettings("memory://", max_redeliveries=0)
    with pytest.raises(ValueError, match="max_body_bytes"):
        BrokerSettings("memory://", max_body_bytes=0)
    options = BrokerSettings.from_options(
        {"url": "memory://", "max_body_bytes": 10, "max_redeliveries": 5}
    )
    assert (options.max_body_bytes, options.max_redeliveries) == (10, 5)


def test_kombu_level_poison_is_dead_lettered_and_the_worker_goes_on(broker, unique_name, caplog):
    # Given a worker and a client on the broker,
    conn = conn_kwargs(broker)
    caplog.set_level(logging.INFO)
    sender = RawSender(unique_name, **conn)
    try:
        with (
            Client(unique_name, **conn) as client,
            running_worker(unique_name, TOPIC, ["worker_tasks"], threads_count=2, **conn) as worker,
        ):
            # when a request arrives whose compression header lies about its
            # body, and one whose headers are not a mapping (AMQP cannot carry those),
            sender.send(
                b'{"not": "zlib"}',
                TOPIC,
                headers={"compression": "application/x-gzip"},
                **request_props(client, "zipped"),
            )
            sent = 1
            if broker.kind != "amqp":
                sender.send(
                    b"{}", TOPIC, headers=["not", "a", "mapping"], **request_props(client, "listed")
                )
                sent += 1
            # and then a good request,
            cid = client.request(wt.Add(), arguments={"x": 40, "y": 2}, routing_key=TOPIC)
            # the good request succeeds on the same worker, without a restart,
            assert client.final(cid)["data"] == {"result": 42}
            # the lying one got a FAILURE that says why,
            final = client.final("zipped")
            assert final["state"] == "FAILURE"
            assert "compressed" in json.dumps(final["data"])
            proxy = worker.server.proxy
            # (its FAILURE goes out before it is dead-lettered)
            waiting.wait_until(
                lambda: proxy.dead_lettered == {f"{unique_name}_{TOPIC}.dead": sent},
                "the poison dead-lettered",
            )
            assert proxy.reconnect_count == 0 and proxy.failing is None
    finally:
        sender.close()
    # and each sits in the topic's dead-letter queue with its reason and origin.
    letters = read_dead_letters(broker, unique_name, f"{unique_name}_{TOPIC}.dead")
    assert len(letters) == sent
    by_cid = {}
    for letter in letters:
        original = dl.original_message(letter.headers)
        by_cid[original["properties"]["correlation_id"]] = original
        assert original["queue"] == f"{unique_name}_{TOPIC}"
        assert (original["exchange"], original["routing_key"]) == (unique_name, TOPIC)
    assert "compressed ('application/x-gzip')" in by_cid["zipped"]["reason"]
    assert by_cid["zipped"]["headers"] == {"compression": "application/x-gzip"}
    assert (
        letters[
            [dl.original_message(m.headers)["properties"]["correlation_id"] for m in letters].index(
                "zipped"
            )
        ].body
        == b'{"not": "zlib"}'
    )
    if broker.kind != "amqp":
        assert "headers are a list" in by_cid["listed"]["reason"]
        assert by_cid["listed"]["headers"] == ["not", "a", "mapping"]
    assert "Unexpected error in the consume loop" not in caplog.text


@pytest.mark.parametrize("broker", ["memory", "filesystem"], indirect=True)
def test_an_oversized_request_is_refused_naming_the_limit(broker, unique_name):
    conn = conn_kwargs(broker)
    sender = RawSender(unique_name, **conn)
    try:
        with (
            Client(unique_name, **conn) as client,
            running_worker(
                unique_name, TOPIC, ["worker_tasks"], threads_count=1, max_body_bytes=1000, **conn
            ) as worker,
        ):
            sender.send(json.dumps({"pad": "x" * 2000}), TOPIC, **request_props(client, "big"))
            final = client.final("big")
            assert final["state"] == "FAILURE"
            assert "exceeds the limit of 1000 bytes" in json.dumps(final["data"])
            proxy = worker.server.proxy
            waiting.wait_until(
                lambda: proxy.dead_lettered == {f"{unique_name}_{TOPIC}.dead": 1},
                "the oversized request dead-lettered",
            )
    finally:
        sender.close()
    (letter,) = read_dead_letters(broker, unique_name, f"{unique_name}_{TOPIC}.dead")
    assert "exceeds the limit" in letter.headers[dl.HEADER_REASON]


# Not memory: kombu's memory transport drops what a closed channel left
# unacknowledged (do_restore is off), so nothing comes back to be counted.
@pytest.mark.parametrize(
    "broker",
    [
        "filesystem",
        pytest.param("redis", marks=pytest.mark.broker),
        pytest.param("amqp", marks=pytest.mark.broker),
    ],
    indirect=True,
)
@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_a_message_that_keeps_failing_the_loop_is_dead_lettered_after_n_strikes(
    broker, unique_name, monkeypatch, caplog
):
    # Given a consume loop whose dead-lettering fails unexpectedly three
    # times (an error of the loop's own, the refused message in hand),
    failures_left = [3]
    real_put = dl.DeadLetters.put

    def flaky_put(self, delivery, reason):
        if failures_left[0] > 0:
            failures_left[0] -= 1
            raise RuntimeError("injected fault in the loop's own code")
        return real_put(self, delivery, reason)

    monkeypatch.setattr(dl.DeadLetters, "put", flaky_put)
    monkeypatch.setattr(consumer_mod, "UNEXPECTED_ERROR_BACKOFF_S", 0.01)
    conn = conn_kwargs(broker)
    caplog.set_level(logging.INFO)
    sender = RawSender(unique_name, **conn)
    try:
        with (
            Client(unique_name, **conn) as client,
            running_worker(unique_name, TOPIC, ["worker_tasks"], threads_count=1, **conn) as worker,
        ):
            proxy = worker.server.proxy
            # when a message it refuses arrives,
            sender.send("{not json", TOPIC, **request_props(client, "poison"))
            # it is taken again after each failure, then dead-lettered unread
            # once it was in hand three times (default max_redeliveries),
            waiting.wait_until(
                lambda: sum(proxy.dead_lettered.values()) == 1,
                "the poison dead-lettered after three strikes",
            )
            # the loop counted as failing meanwhile and says so,
            assert "keeps failing" in caplog.text
            assert "stops announcing itself" in caplog.text
            # and it works again: a good request succeeds, the failing state ends.
            cid = client.request(wt.Add(), arguments={"x": 1, "y": 2}, routing_key=TOPIC)
            assert client.final(cid)["data"] == {"result": 3}
            waiting.wait_until(lambda: proxy.failing is None, "the loop working again")
            # The loop clears its failing state, then tells its observers (the
            # server, which logs the announcement): wait for that too.
            waiting.wait_until(
                lambda: "announces itself on topic 'calc' again" in caplog.text,
                "the worker announcing itself again",
            )
            assert worker.describe()["failing"] == {}
    finally:
        sender.close()
    (letter,) = read_dead_letters(broker, unique_name, f"{unique_name}_{TOPIC}.dead")
    assert letter.headers[dl.HEADER_REASON] == "it was in hand 3 times when the consume loop failed"
    assert caplog.text.count("while handling a message") == 3


@pytest.mark.parametrize(
    "broker",
    [
        "memory",
        "filesystem",
        pytest.param("redis", marks=pytest.mark.broker),
        pytest.param("amqp", marks=pytest.mark.broker),
    ],
    indirect=True,
)
@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_a_burst_of_refused_replies_is_dead_lettered_in_order(broker, unique_name):
    # py-amqp hands deliveries over inside any read of the connection, the
    # dead-lettering's own waits for the broker included: the loop used to
    # handle them nested in the handler of the message before (so out of
    # order) and, as py-amqp's wait for an answer is not re-entrant, could
    # lose one answer and wait for ever, until RabbitMQ dropped the
    # connection at its heartbeat timeout with the replies in flight.
    # Given an engine-style reply consumer (private, unacknowledged on
    # AMQP) that has refused nothing yet,
    count = 40
    exchange = kombu.Exchange(unique_name, type="direct", durable=False)
    name = f"{unique_name}_replies"
    spec = consumer_mod.QueueSpec(
        name, (name,), auto_delete=True, private=True, batched=True, outlives_connection=True
    )
    settings_ = BrokerSettings(url=broker.url, transport_options=dict(broker.transport_options))
    consumer = consumer_mod.Consumer(name, settings_, exchange, [spec], TypeDispatcher({}))
    thread = threading.Thread(target=consumer.start, daemon=True, name="burst-consumer")
    thread.start()
    sender = RawSender(unique_name, **conn_kwargs(broker))
    try:
        assert consumer.wait(waiting.WAIT_S), "the consumer did not start"
        # when a burst of messages it refuses arrives at once,
        for i in range(count):
            sender.send(json.dumps({"i": i}), name, type=pr.NOTIFY, correlation_id=f"m{i}")
        # every one is dead-lettered, once, in the order it came, on the
        # connection it came on.
        waiting.wait_until(
            lambda: sum(consumer.dead_lettered.values()) >= count,
            f"{count} messages dead-lettered",
        )
        assert consumer.reconnect_count == 0
    finally:
        consumer.stop()
        thread.join(waiting.WAIT_S)
        sender.close()
    letters = read_dead_letters(broker, unique_name, f"{unique_name}{dl.SUFFIX}")
    properties = [dl.original_message(letter.headers)["properties"] for letter in letters]
    assert [p.get("correlation_id") for p in properties] == [f"m{i}" for i in range(count)]
