"""flowengine's AMQP delivery reader gives exactly what py-amqp's readers give.

Each input is read both ways (py-amqp's ``decode_properties_basic``,
``loads('sLbss', ...)`` and ``frame_handler``, and :mod:`amqp_reading`'s
counterparts) and the outcomes compared: the values, or the exception's
type and text. Inputs are generated as wire bytes: every table value type
(those the reader leaves to py-amqp and letters py-amqp refuses
included), strings that are not UTF-8, and the same frames truncated or
with a byte changed. A delivery is dispatched by flowengine's channel as
by kombu's (listeners, one-shot waiters, a closing channel, body
decoding, malformed arguments). Then against a real rabbitmq-server: an ``amqp://``
connection reads its deliveries this way and gets what plain py-amqp gets.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import uuid
from typing import Any

import amqp
import kombu
import pytest
from amqp import method_framing
from amqp import serialization as amqp_serialization
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kombu.transport import pyamqp

from flowengine.engines.worker_based.transports import amqp as amqp_transport
from flowengine.engines.worker_based.transports import amqp_codec, amqp_reading
from tests.worker_based import amqp_samples

# A request's properties, with a big integer and a nested table among its headers.
REQUEST_PROPERTIES = dict(
    amqp_samples.REQUEST_PROPERTIES,
    application_headers={**amqp_samples.REQUEST_HEADERS, "big": 2**40, "nested": {"a": -1}},
)


def outcome(read: Any, *args: Any) -> tuple[str, str]:
    """What ``read(*args)`` gives: its result (repr: types, NaN, -0.0 told apart) or its error."""
    try:
        return "value", _typed_repr(read(*args))
    except Exception as e:
        return "error", f"{type(e).__name__}: {e}"


def _typed_repr(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{_typed_repr(k)}: {_typed_repr(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "[" + ", ".join(_typed_repr(v) for v in value) + "]"
    return f"{type(value).__name__}:{value!r}"


# -- wire bytes ----------------------------------------------------------

short_bytes = st.binary(max_size=20) | st.text(max_size=12).map(
    lambda s: s.encode("utf-8", "surrogatepass")
)


def _short(data: bytes) -> bytes:
    return bytes([len(data)]) + data


def _long(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


# Fixed-size values: letter and size. The reader reads the first ones itself.
_READ = [(b"I", 4), (b"i", 4), (b"L", 8), (b"l", 8), (b"s", 2), (b"U", 2), (b"u", 2), (b"b", 1),
         (b"B", 1), (b"d", 8), (b"f", 4), (b"t", 1)]  # fmt: skip
_LEFT_TO_PY_AMQP = [(b"D", 5), (b"T", 8)]


def _value(children: st.SearchStrategy[bytes], *, odd: bool) -> st.SearchStrategy[bytes]:
    letters = st.sampled_from(_READ + (_LEFT_TO_PY_AMQP if odd else []))
    fixed = st.tuples(letters, st.binary(min_size=8, max_size=8)).map(
        lambda t: t[0][0] + t[1][: t[0][1]]
    )
    strings = st.tuples(st.sampled_from([b"S", b"x"]), short_bytes).map(
        lambda t: t[0] + _long(t[1])
    )
    tables = st.lists(st.tuples(short_bytes, children), max_size=4).map(
        lambda items: b"F" + _long(b"".join(_short(k) + v for k, v in items))
    )
    arrays = st.lists(children, max_size=4).map(lambda items: b"A" + _long(b"".join(items)))
    # void, and (odd) letters py-amqp refuses
    other = st.sampled_from([b"V", b"Z", b"\x00"] if odd else [b"V"])
    return fixed | strings | tables | arrays | other


def _tables(*, odd: bool) -> st.SearchStrategy[bytes]:
    values = st.recursive(
        st.just(b"V") | st.builds(lambda s: b"S" + _long(s), short_bytes),
        lambda children: _value(children, odd=odd),
        max_leaves=12,
    )
    return st.lists(st.tuples(short_bytes, values), max_size=6).map(
        lambda items: _long(b"".join(_short(k) + v for k, v in items))
    )


@st.composite
def properties_bytes(draw: st.DrawFn, *, odd: bool = True) -> bytes:
    """Property flags and list of a basic content header (any flags, each property's wire form).

    ``odd``: table values the reader leaves to py-amqp may appear.
    """
    flags = draw(st.integers(0, 0xFFFF))
    tables = _tables(odd=odd)
    parts = [struct.pack(">H", flags)]
    for i, (_name, kind) in enumerate(amqp.Message.PROPERTIES):
        if flags & (1 << (15 - i)):
            if kind == "s":
                parts.append(_short(draw(short_bytes)))
            elif kind == "F":
                parts.append(draw(tables))
            elif kind == "o":
                parts.append(draw(st.binary(min_size=1, max_size=1)))
            else:
                parts.append(draw(st.binary(min_size=8, max_size=8)))
    return b"".join(parts)


@st.composite
def damaged(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    """A frame as made, cut short, with a byte changed, or with bytes after it."""
    data = draw(frames)
    how = draw(st.sampled_from(["whole", "cut", "changed", "longer"]))
    if how == "cut" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "changed" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    if how == "longer":
        return data + draw(st.binary(min_size=1, max_size=8))
    return data


def _request_properties() -> bytes:
    return amqp_codec.serialize_basic_properties(REQUEST_PROPERTIES)


# -- content header properties ----------------------------------------------


def test_a_request_s_properties_are_read_as_py_amqp_reads_them_without_its_help():
    data = _request_properties()
    assert outcome(amqp_reading.decode_basic_properties, data, 0) == outcome(
        amqp_serialization.decode_properties_basic, data, 0
    )
    # the reader read it itself: no switch to py-amqp's reader
    assert amqp_reading._read_properties(data, 0) == (REQUEST_PROPERTIES, len(data))


# Every fixed-size letter with its top bit set (signed or not, as py-amqp reads it).
_SIGNS = b"".join(
    bytes([1, ord("a") + i]) + letter + b"\xff" * size for i, (letter, size) in enumerate(_READ)
)


@settings(max_examples=300)
@given(properties_bytes(odd=False), st.integers(0, 3))
@example(b"\x20\x00" + struct.pack(">I", len(_SIGNS)) + _SIGNS, 0)
def test_well_formed_properties_are_read_as_py_amqp_reads_them_without_its_help(
    data: bytes, offset: int
) -> None:
    data = b"\x00" * offset + data
    assert outcome(amqp_reading._read_properties, data, offset) == outcome(
        amqp_serialization.decode_properties_basic, data, offset
    )


@settings(max_examples=300)
@given(damaged(properties_bytes()), st.integers(0, 3))
@example(b"\x00\x04", 0)  # a flag py-amqp ignores
@example(b"\x01\x00\x02\xff\xfe", 0)  # reply_to not UTF-8: bytes
@example(b"\x20\x00\x00\x00\x00\x05\x01\xffS\x00\x00", 0)  # a key not UTF-8, a cut string
@example(b"\x20\x00\x00\x00\x00\x02\x01a", 0)  # a key and no value within the table
@example(b"\x24\x00\x00\x00\x00\x09\x01aS\x00\x00\x00\x03xy\x02zz", 0)  # a string past its table
def test_any_properties_are_read_as_py_amqp_reads_them(data: bytes, offset: int) -> None:
    data = b"\x00" * offset + data
    assert outcome(amqp_reading.decode_basic_properties, data, offset) == outcome(
        amqp_serialization.decode_properties_basic, data, offset
    )


@pytest.mark.broker  # a fresh interpreter: a process of its own (tests/fast_tier.py)
def test_loading_the_reader_alone_makes_py_amqp_read_as_it_does():
    # In a fresh interpreter that loads amqp_reading and not amqp.py: a
    # reply_to that is not UTF-8 in a header the reader hands to py-amqp
    # (a decimal in its table) comes out as bytes both ways, not as bytes
    # from one reader and an error from the other.
    script = """
import struct
from amqp import serialization
from flowengine.engines.worker_based.transports import amqp_reading
table = b"\\x01dD\\x02\\x00\\x00\\x00\\x07"
data = b"\\x22\\x00" + struct.pack(">I", len(table)) + table + b"\\x02\\xff\\xfe"
fast, _ = amqp_reading.decode_basic_properties(data, 0)
slow, _ = serialization.decode_properties_basic(data, 0)
assert fast == slow and fast["reply_to"] == b"\\xff\\xfe", (fast, slow)
print("ok", sorted(fast))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "['application_headers',", "'reply_to']"]


@given(st.binary(max_size=64))
def test_random_bytes_are_read_or_refused_as_py_amqp_does(data: bytes) -> None:
    assert outcome(amqp_reading.decode_basic_properties, data, 0) == outcome(
        amqp_serialization.decode_properties_basic, data, 0
    )


def test_a_bytearray_keeps_py_amqp_s_reading():
    # py-amqp leaves a bytearray's strings undecoded: so does the reader.
    data = bytearray(_request_properties())
    assert outcome(amqp_reading.decode_basic_properties, data, 0) == outcome(
        amqp_serialization.decode_properties_basic, data, 0
    )


# -- Basic.Deliver ------------------------------------------------------------


@st.composite
def deliver_payloads(draw: st.DrawFn) -> bytes:
    return (
        struct.pack(">HH", *amqp_reading.BASIC_DELIVER)
        + _short(draw(short_bytes))
        + draw(st.binary(min_size=8, max_size=8))
        + draw(st.binary(min_size=1, max_size=1))
        + _short(draw(short_bytes))
        + _short(draw(short_bytes))
    )


@settings(max_examples=300)
@given(damaged(deliver_payloads()))
@example(b"\x00<\x00<\x03\xff\xfe\xfd" + b"\x00" * 8 + b"\x01\x00\x00")  # a tag not UTF-8
@example(b"\x00<\x00<\x00" + b"\x00" * 8)  # no redelivered octet
def test_deliver_arguments_are_read_as_py_amqp_reads_them(payload: bytes) -> None:
    assert outcome(amqp_reading.decode_deliver_arguments, payload) == outcome(
        lambda p: amqp_serialization.loads("sLbss", p, 4)[0], payload
    )


# -- frame assembly -------------------------------------------------------------


class _Connection:
    bytes_recv = 0


def _assemble(make_handler: Any, frames: list[tuple[int, int, bytes]]) -> list[Any]:
    """What a frame handler passes on (or raises) for each frame, in order."""
    got: list[Any] = []

    def callback(channel: int, method_sig: Any, args: bytes, content: Any) -> None:
        got.append(("method", channel, method_sig, args))
        if content is not None:
            got.append(
                ("content", content.body_size, content.body, _typed_repr(content.properties))
            )

    connection = _Connection()
    on_frame = make_handler(connection, callback)
    for frame in frames:
        try:
            got.append(("done", on_frame(frame)))
        except Exception as e:
            got.append(("error", f"{type(e).__name__}: {e}"))
            break
    got.append(("frames counted", connection.bytes_recv))
    return got


_SIGS = [amqp_reading.BASIC_DELIVER, (60, 71), (60, 50), (60, 80), (20, 40), (10, 50)]


@st.composite
def frame_sequences(draw: st.DrawFn) -> list[tuple[int, int, bytes]]:
    frames = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from([1, 1, 2, 3, 8, 4]))
        channel = draw(st.integers(0, 2))
        if kind == 1:
            payload = struct.pack(">HH", *draw(st.sampled_from(_SIGS))) + draw(
                st.binary(max_size=8)
            )
        elif kind == 2:
            class_id = draw(st.sampled_from([60, 60, 60, 50]))
            size = draw(st.integers(0, 6))
            payload = struct.pack(">HHQ", class_id, 0, size) + draw(properties_bytes())
        else:
            payload = draw(st.binary(max_size=6))
        frames.append((kind, channel, draw(damaged(st.just(payload))) if kind < 3 else payload))
    return frames


@settings(max_examples=300)
@given(frame_sequences())
def test_frames_are_assembled_as_py_amqp_assembles_them(frames: list[Any]) -> None:
    assert _assemble(amqp_reading.frame_handler, frames) == _assemble(
        method_framing.frame_handler, frames
    )


# -- on a real RabbitMQ -------------------------------------------------------


@pytest.mark.broker
def test_an_amqp_connection_reads_deliveries_as_plain_py_amqp_does(amqp_url):
    """Given messages with odd properties published by plain py-amqp (bytes kept as sent),
    when read through flowengine's transport and through plain py-amqp,
    then both read the same delivery info, properties and bodies."""
    queue = "reading-" + uuid.uuid4().hex
    headers = REQUEST_PROPERTIES["application_headers"]
    sent = [
        amqp.Message("hello", application_headers=headers, type="REQUEST", reply_to="r"),
        amqp.Message(b"\xff\xfe", application_headers={"a": [1, 2.5, None, {"b": b"\xff"}]}),
        amqp.Message("", correlation_id="x" * 255, priority=3, delivery_mode=2, timestamp=12345),
    ]
    # A property that is not UTF-8 (bytes, as py-amqp writes them).
    sent.append(amqp.Message("poison", reply_to=b"\xff\xfe", type="RESPONSE"))

    def read(transport: Any) -> list[Any]:
        with kombu.Connection(amqp_url, transport=transport) as conn:
            channel = conn.default_channel
            channel.queue_declare(queue, auto_delete=False)
            for message in sent:
                channel.basic_publish(message, routing_key=queue)
            got: list[Any] = []
            channel.basic_consume(queue, callback=got.append, no_ack=True)
            while len(got) < len(sent):
                conn.drain_events(timeout=10)
            channel.queue_delete(queue)
            info = [
                (dict(m.delivery_info, consumer_tag=None, delivery_tag=None), m.properties, m.body)
                for m in got
            ]
            reader = conn.connection.on_inbound_frame.__module__
            assert reader == (
                "amqp.method_framing" if transport == "pyamqp" else amqp_reading.__name__
            )
            return [_typed_repr(each) for each in info]

    assert read(amqp_transport.Transport) == read("pyamqp")


# -- dispatch of a delivery -------------------------------------------------------


def _dispatched(channel_cls: Any, case: str, payload: bytes, body: Any) -> list[Any]:
    """What a channel's dispatch_method does with a Basic.Deliver (no broker: not connected)."""
    connection = pyamqp.Connection(host="127.0.0.1:1")
    channel = channel_cls(connection, 1)
    seen: list[Any] = []
    channel.callbacks["tag"] = lambda message: seen.append(
        ("consumer", _typed_repr(message.delivery_info), _typed_repr(message.body))
    )
    if case in ("no listener", "nobody"):
        del channel._callbacks[amqp_reading.BASIC_DELIVER]
    if case in ("one-shot", "no listener"):
        channel._pending[amqp_reading.BASIC_DELIVER] = lambda sig, *args: seen.append(
            ("one-shot", _typed_repr(args[:-1]))
        )
    if case == "closing":
        channel.is_closing = True
    if case == "no auto-decode":
        channel.auto_decode = False
    message = amqp.Message(body, content_encoding="utf-8" if case != "bad encoding" else "nope")
    seen.append(
        ("returned", outcome(channel.dispatch_method, amqp_reading.BASIC_DELIVER, payload, message))
    )
    seen.append(("pending left", list(channel._pending)))
    return seen


_DELIVER = (
    struct.pack(">HH", *amqp_reading.BASIC_DELIVER) + _short(b"tag") + struct.pack(">QB", 7, 1)
    + _short(b"exchange") + _short(b"key")
)  # fmt: skip


@pytest.mark.parametrize(
    "case",
    ["plain", "one-shot", "no listener", "nobody", "closing", "no auto-decode", "bad encoding"],
)
@pytest.mark.parametrize(
    "payload",
    [_DELIVER, _DELIVER[:-2], _DELIVER.replace(b"tag", b"t\xffg")],
    ids=["ok", "cut", "bad tag"],
)
@pytest.mark.parametrize("body", [b"caf\xc3\xa9", b"\xff"], ids=["utf8", "not-utf8"])
def test_a_delivery_is_dispatched_as_py_amqp_dispatches_it(case: str, payload: bytes, body: bytes):
    assert _dispatched(amqp_transport.Channel, case, payload, body) == _dispatched(
        pyamqp.Channel, case, payload, body
    )
