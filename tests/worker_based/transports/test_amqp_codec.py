"""flowengine's AMQP property writer puts on the wire exactly what py-amqp would.

Each case is written both ways (py-amqp's ``Message._serialize_properties``
and :class:`amqp_codec.FastPropertiesMessage`) and the bytes compared: the
headers flowengine sends, every value type py-amqp writes (those the codec
leaves to py-amqp included), random nested headers, and values py-amqp
refuses (refused the same way). Then against a real rabbitmq-server: an
``amqp://`` connection's channels use the codec, and what they publish is
read back by plain py-amqp as it was sent.
"""

from __future__ import annotations

import datetime
import decimal
import random
import string
import struct
import uuid
from typing import Any

import amqp
import kombu
import pytest
from amqp.exceptions import FrameSyntaxError

from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.transports import amqp_codec
from tests.worker_based.amqp_samples import REQUEST_HEADERS, REQUEST_PROPERTIES


def both(properties: dict[str, Any]) -> tuple[bytes, bytes]:
    """The properties as py-amqp writes them, and as the codec does."""
    ours = amqp_codec.FastPropertiesMessage("body", **properties)._serialize_properties()
    theirs = amqp.Message("body", **properties)._serialize_properties()
    return ours, theirs


def test_a_request_is_written_byte_for_byte_as_py_amqp_writes_it():
    ours, theirs = both(REQUEST_PROPERTIES)
    assert ours == theirs
    # and the codec wrote it itself (no fallback to py-amqp's writer)
    assert amqp_codec.serialize_basic_properties(REQUEST_PROPERTIES) == theirs


@pytest.mark.parametrize(
    "properties",
    [
        {},
        {"type": "NOTIFY"},
        {"type": ""},  # an empty short string is sent
        {"type": b"raw bytes"},
        {"correlation_id": "\udcff surrogate"},  # surrogatepass, as py-amqp
        {"application_headers": {}},
        {"application_headers": None, "priority": 9},
        {"timestamp": 1764400000, "message_id": "m", "user_id": "u", "app_id": "a"},
        {"expiration": "60000", "cluster_id": "c", "delivery_mode": 1},
        {"application_headers": {"big": 2**40, "neg": -(2**40), "edge": 2147483647}},
        {"application_headers": {"edge-": -2147483647, "past": -2147483648}},
        {"application_headers": {"t": True, "f": False, "n": None, "z": 0, "e": ""}},
        {"application_headers": {"nested": {"a": [1, "x", {"b": None}], "c": (2.5,)}}},
        {"application_headers": {b"bytes-key": b"bytes-value", "uni": "été ☃"}},
    ],
)
def test_every_value_flowengine_writes_is_written_as_py_amqp_writes_it(properties):
    ours, theirs = both(properties)
    assert ours == theirs
    assert amqp_codec.serialize_basic_properties(properties) == theirs


@pytest.mark.parametrize(
    "headers",
    [
        {"when": datetime.datetime(2026, 11, 29, 12, 0, 0)},
        {"price": decimal.Decimal("12.34")},
        {"deep": {"list": [decimal.Decimal("1.5")]}},
    ],
)
def test_types_left_to_py_amqp_are_still_written_by_py_amqp(headers):
    properties = {"application_headers": headers, "type": "X"}
    with pytest.raises(Exception):  # the codec does not write these itself
        amqp_codec.serialize_basic_properties(properties)
    ours, theirs = both(properties)
    assert ours == theirs


@pytest.mark.parametrize(
    ("properties", "error"),
    [
        ({"application_headers": {"obj": object()}}, FrameSyntaxError),
        ({"type": "x" * 256}, struct.error),  # a short string holds 255 bytes
    ],
)
def test_values_py_amqp_refuses_are_refused_with_its_error(properties, error):
    with pytest.raises(error):
        amqp.Message("body", **properties)._serialize_properties()
    with pytest.raises(error):
        amqp_codec.FastPropertiesMessage("body", **properties)._serialize_properties()


def _random_value(rng: random.Random, depth: int) -> Any:
    kinds = ["str", "int", "bigint", "float", "bool", "none", "bytes"]
    if depth < 3:
        kinds += ["dict", "list"]
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice(string.printable + "éß☃") for _ in range(rng.randrange(40)))
    if kind == "int":
        return rng.randrange(-(2**31) + 1, 2**31)
    if kind == "bigint":
        return rng.choice([-1, 1]) * rng.randrange(2**31, 2**62)
    if kind == "float":
        return rng.uniform(-1e12, 1e12)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "bytes":
        return rng.randbytes(rng.randrange(20))
    if kind == "dict":
        return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(5))}
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]


def test_random_headers_are_written_as_py_amqp_writes_them():
    rng = random.Random(38)
    for _ in range(500):
        headers = {f"h{i}": _random_value(rng, 0) for i in range(rng.randrange(12))}
        properties = dict(REQUEST_PROPERTIES, application_headers=headers)
        ours, theirs = both(properties)
        assert ours == theirs, headers


@pytest.mark.broker
def test_an_amqp_connection_publishes_through_the_codec_and_py_amqp_reads_it_back(amqp_url):
    # Given a flowengine amqp:// connection and a queue,
    name = f"codec-{uuid.uuid4().hex[:8]}"
    with transports.connection(amqp_url, None) as conn:
        channel = conn.channel()
        assert isinstance(channel.prepare_message(b"x"), amqp_codec.FastPropertiesMessage)
        queue = kombu.Queue(
            name, kombu.Exchange(name, type="direct"), routing_key=name, auto_delete=True
        )
        queue(channel).declare()
        # when it publishes a request's properties and headers,
        producer = kombu.Producer(channel, exchange=queue.exchange)
        producer.publish(
            b'{"a": 1}',
            routing_key=name,
            content_type="application/json",
            content_encoding="utf-8",
            headers=REQUEST_HEADERS,
            type="REQUEST",
            correlation_id=REQUEST_PROPERTIES["correlation_id"],
            reply_to=REQUEST_PROPERTIES["reply_to"],
        )
        # then plain py-amqp (kombu's own transport) reads them back as sent.
        received: list[Any] = []
        with kombu.Connection(amqp_url) as plain:
            assert not isinstance(plain.transport, transports.amqp.Transport)
            with plain.Consumer(
                queue, callbacks=[lambda body, m: received.append(m)], accept=["json"], no_ack=True
            ):
                plain.drain_events(timeout=10)
        (message,) = received
        assert message.headers == REQUEST_HEADERS
        assert message.properties["type"] == "REQUEST"
        assert message.properties["correlation_id"] == REQUEST_PROPERTIES["correlation_id"]
        assert message.decode() == {"a": 1}
