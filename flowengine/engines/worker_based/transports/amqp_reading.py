"""AMQP deliveries read in fewer steps: Basic.Deliver's arguments and the content header.

py-amqp reads a delivery's arguments with its generic format interpreter
(``loads('sLbss', ...)``: a branch ladder and a ``struct`` call per
letter) and a content header field by field, each table key and string
through a Python helper; with flowengine's ten or so headers that was
about a third of the CPU a consume loop spent reading a message. Timed
apart (best of 5): a request's properties (13 headers) 11.9 -> 7.5 us,
Basic.Deliver's arguments 1.5 -> 0.6 us; a delivery from its three frames
to kombu's message, in one process, 26.1 [25.5-29.0] -> 20.6 [19.8-22.1]
us (5 interleaved runs, median [min-max]).
:func:`decode_deliver_arguments` and :func:`decode_basic_properties` give
the same values in fewer steps for a well-formed frame, and hand anything
else (a truncated frame, a table value type they leave alone: decimals,
timestamps, unknown letters) to py-amqp's own readers, so what comes out,
or what is raised, for any input is py-amqp's: the tests compare the two
on generated frames, malformed ones included. Strings that are not UTF-8
come out as :func:`tolerate_undecodable_properties` makes py-amqp read them
(bytes), except Basic.Deliver's, which py-amqp refuses. Loading this
module applies it, so that py-amqp's readers, which this module falls back
on, and its own fast ones agree.

:func:`frame_handler` assembles frames as py-amqp's does (method, header
and body frames into one message per channel, the same errors), making
each message a :class:`HeaderReadingMessage`, whose header goes through
:func:`decode_basic_properties`. flowengine's connections (TLS ones too)
use both: see :mod:`.amqp`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from amqp import serialization as amqp_serialization  # type: ignore[attr-defined]
from amqp import spec as amqp_spec  # type: ignore[attr-defined]
from amqp.basic_message import Message as AmqpMessage  # type: ignore[import-untyped]
from amqp.exceptions import UnexpectedFrame

__all__ = [
    "BASIC_DELIVER",
    "HeaderReadingMessage",
    "decode_basic_properties",
    "decode_deliver_arguments",
    "frame_handler",
    "tolerate_undecodable_properties",
]

BASIC_DELIVER: tuple[int, int] = amqp_spec.Basic.Deliver

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_METHOD_SIG = struct.Struct(">HH")
# class id, weight (ignored), body size.
_CONTENT_HEADER = struct.Struct(">HxxQ")

# The methods followed by a content header (and body) frame.
_CONTENT_METHODS = frozenset(
    (amqp_spec.Basic.Deliver, amqp_spec.Basic.GetOk, amqp_spec.Basic.Return)
)
_HEARTBEAT = 8

# The basic class's properties in wire order with their flag bit and type
# letter (s short string, F table, o octet, L long long): py-amqp's list.
_BASIC: tuple[tuple[int, str, str], ...] = tuple(
    (1 << (15 - i), name, kind) for i, (name, kind) in enumerate(AmqpMessage.PROPERTIES)
)

# Property flags -> the (name, type letter) of each property present, in
# wire order: publishers set the same few properties every time, so a few
# plans serve every message (bounded: a peer chooses the flags).
_PLANS: dict[int, tuple[tuple[str, str], ...]] = {}
_MAX_PLANS = 64

# Fixed-size table values: letter -> (reader, size).
_FIXED: dict[int, tuple[struct.Struct, int]] = {
    ord("I"): (_I32, 4),
    ord("i"): (_U32, 4),
    ord("L"): (_I64, 8),
    ord("l"): (_I64, 8),
    ord("s"): (_I16, 2),  # RabbitMQ's signed 16-bit, as py-amqp reads it
    ord("U"): (_I16, 2),
    ord("u"): (_U16, 2),
    ord("b"): (_I8, 1),
    ord("d"): (_F64, 8),
    ord("f"): (_F32, 4),
}
_LONG_STRING, _BYTES, _BOOL, _VOID, _TABLE, _ARRAY, _UNSIGNED_OCTET = (ord(c) for c in "SxtVFAB")


class _Unread(Exception):
    """Something this module leaves to py-amqp (raised to switch to its reader)."""


def _text(raw: bytes) -> str | bytes:
    # As py-amqp with tolerate_undecodable_properties: UTF-8, else the bytes.
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return raw


def _table(buf: bytes, offset: int, end: int) -> tuple[dict[Any, Any], int]:
    """The table whose size is at ``offset``, and the offset after it (within ``end``)."""
    size: int = _U32.unpack_from(buf, offset)[0]
    offset += 4
    limit = offset + size
    if limit > end:
        raise _Unread()
    table: dict[Any, Any] = {}
    while offset < limit:
        start = offset + 1
        offset = start + buf[offset]
        if offset >= limit:  # a key needs a value after it
            raise _Unread()
        # Keys and strings as py-amqp with tolerate_undecodable_properties:
        # UTF-8, else the bytes (inline: the commonest steps of a read).
        raw = buf[start:offset]
        try:
            key: Any = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            key = raw
        kind = buf[offset]
        if kind == _LONG_STRING:
            start = offset + 5
            offset = start + _U32.unpack_from(buf, offset + 1)[0]
            if offset > limit:
                raise _Unread()
            raw = buf[start:offset]
            try:
                table[key] = raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                table[key] = raw
            continue
        fixed = _FIXED.get(kind)
        if fixed is None:
            table[key], offset = _value(buf, offset, limit)
            continue
        reader, size = fixed
        start = offset + 1
        offset = start + size
        if offset > limit:
            raise _Unread()
        table[key] = reader.unpack_from(buf, start)[0]
    return table, offset


def _value(buf: bytes, offset: int, limit: int) -> tuple[Any, int]:
    """The table or array value at ``offset``, and the offset after it (within ``limit``)."""
    kind = buf[offset]
    offset += 1
    value: Any
    if kind == _LONG_STRING or kind == _BYTES:
        size: int = _U32.unpack_from(buf, offset)[0]
        start = offset + 4
        offset = start + size
        if offset > limit:
            raise _Unread()
        value = _text(buf[start:offset]) if kind == _LONG_STRING else buf[start:offset]
        return value, offset
    fixed = _FIXED.get(kind)
    if fixed is not None:
        reader, size = fixed
        if offset + size > limit:
            raise _Unread()
        return reader.unpack_from(buf, offset)[0], offset + size
    if kind == _VOID:
        return None, offset
    if kind == _BOOL or kind == _UNSIGNED_OCTET:
        if offset >= limit:
            raise _Unread()
        return (bool(buf[offset]) if kind == _BOOL else buf[offset]), offset + 1
    if kind == _TABLE:
        return _table(buf, offset, limit)
    if kind == _ARRAY:
        size = _U32.unpack_from(buf, offset)[0]
        offset += 4
        array_end = offset + size
        if array_end > limit:
            raise _Unread()
        items = []
        while offset < array_end:
            item, offset = _value(buf, offset, array_end)
            items.append(item)
        return items, offset
    raise _Unread()  # decimals, timestamps, letters py-amqp refuses


def _read_properties(buf: bytes, offset: int) -> tuple[dict[str, Any], int]:
    if type(buf) is not bytes:  # py-amqp keeps a bytearray's strings undecoded
        raise _Unread()
    end = len(buf)
    flags: int = _U16.unpack_from(buf, offset)[0]
    offset += 2
    plan = _PLANS.get(flags)
    if plan is None:
        plan = tuple((name, kind) for bit, name, kind in _BASIC if flags & bit)
        if len(_PLANS) < _MAX_PLANS:
            _PLANS[flags] = plan
    properties: dict[str, Any] = {}
    for name, kind in plan:
        if kind == "s":
            start = offset + 1
            offset = start + buf[offset]
            if offset > end:
                raise _Unread()
            raw = buf[start:offset]
            try:
                properties[name] = raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                properties[name] = raw
        elif kind == "F":
            properties[name], offset = _table(buf, offset, end)
        elif kind == "o":
            properties[name] = buf[offset]
            offset += 1
        else:  # "L": the timestamp
            properties[name] = _U64.unpack_from(buf, offset)[0]
            offset += 8
    return properties, offset


def decode_basic_properties(buf: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """A basic content header's properties from ``offset``, and the offset after them.

    The same as py-amqp's ``decode_properties_basic`` for every input, or
    the same exception (it decides whenever this reader would not).
    """
    try:
        return _read_properties(buf, offset)
    except Exception:
        result: tuple[dict[str, Any], int] = amqp_serialization.decode_properties_basic(buf, offset)
        return result


def decode_deliver_arguments(payload: bytes) -> list[Any]:
    """Basic.Deliver's arguments (consumer tag, delivery tag, redelivered, exchange, routing key).

    The same as py-amqp's ``loads('sLbss', payload, 4)[0]`` for every
    payload, or the same exception (a tag or name that is not UTF-8 raises
    UnicodeDecodeError there).
    """
    try:
        if type(payload) is not bytes:
            raise _Unread()
        tag_end = 5 + payload[4]
        delivery_tag: int = _U64.unpack_from(payload, tag_end)[0]
        redelivered = bool(payload[tag_end + 8] & 1)
        exchange_end = tag_end + 10 + payload[tag_end + 9]
        key_end = exchange_end + 1 + payload[exchange_end]
        if key_end > len(payload):
            raise _Unread()
        return [
            payload[5:tag_end].decode("utf-8", "surrogatepass"),
            delivery_tag,
            redelivered,
            payload[tag_end + 10 : exchange_end].decode("utf-8", "surrogatepass"),
            payload[exchange_end + 1 : key_end].decode("utf-8", "surrogatepass"),
        ]
    except Exception:
        values: list[Any] = amqp_serialization.loads("sLbss", payload, 4)[0]
        return values


class HeaderReadingMessage(AmqpMessage):  # type: ignore[misc]
    """py-amqp's message, its basic content header read by decode_basic_properties()."""

    def inbound_header(self, buf: bytes, offset: int = 0) -> int:
        class_id, self.body_size = _CONTENT_HEADER.unpack_from(buf, offset)
        if class_id != self.CLASS_ID:
            return int(super().inbound_header(buf, offset))  # py-amqp's error
        self.properties = decode_basic_properties(buf, offset + _CONTENT_HEADER.size)[0]
        if not self.body_size:
            self.ready = True
        return offset + _CONTENT_HEADER.size


def frame_handler(
    connection: Any, callback: Callable[[int, tuple[int, int], bytes, Any], Any]
) -> Callable[[tuple[int, int, bytes]], bool]:
    """py-amqp's frame assembly (its ``frame_handler``), messages made as HeaderReadingMessage.

    Returns the function the connection gives each frame read: True when
    it completed a method (``callback`` called), False when more frames
    are needed. Raises UnexpectedFrame for a frame out of order, as
    py-amqp does.
    """
    expected: dict[int, int] = {}  # channel -> frame type awaited (1 when absent)
    partial: dict[int, Any] = {}  # channel -> message awaiting its header or body

    def on_frame(frame: tuple[int, int, bytes]) -> bool:
        frame_type, channel, buf = frame
        connection.bytes_recv += 1
        awaited = expected.get(channel, 1)
        if frame_type != awaited and frame_type != _HEARTBEAT:
            raise UnexpectedFrame(f"Received frame {frame_type} while expecting type: {awaited}")
        if frame_type == 1:
            method_sig = _METHOD_SIG.unpack_from(buf, 0)
            if method_sig in _CONTENT_METHODS:
                partial[channel] = HeaderReadingMessage(frame_method=method_sig, frame_args=buf)
                expected[channel] = 2
                return False
            callback(channel, method_sig, buf, None)
            return True
        if frame_type == _HEARTBEAT:
            return False
        message = partial[channel]
        if frame_type == 2:
            message.inbound_header(buf)
            if not message.ready:
                expected[channel] = 3
                return False
        else:
            message.inbound_body(buf)
            if not message.ready:
                return False
        expected[channel] = 1
        del partial[channel]
        callback(channel, message.frame_method, message.frame_args, message)
        return True

    return on_frame


def tolerate_undecodable_properties() -> None:
    """Make py-amqp read a message property that is not UTF-8 as bytes (idempotent).

    py-amqp decodes each string property of a message (``reply_to``,
    ``type``, ``correlation_id``...) while it parses the frame, before any
    consumer sees the message: one that is not UTF-8 raised there, the
    connection was lost with the message unacknowledged, and the broker
    gave it back to the next connection for ever, so one published message
    stopped a consume loop for good. Read as bytes, as py-amqp
    reads such table values, the property reaches the consume loop, which
    refuses a message whose properties are not strings (dead-lettered).
    """
    amqp_serialization.pstr_t = _bytes_to_str


def _bytes_to_str(value: Any) -> Any:
    """py-amqp's ``bytes_to_str``, keeping bytes that are not UTF-8 as they are."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return value
    return value


# This module's readers and py-amqp's (its fall-back) must read a string the
# same way, whoever imports it first.
tolerate_undecodable_properties()
