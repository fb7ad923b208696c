"""AMQP frames written in one pass: a publication's three frames, an acknowledgement.

py-amqp writes every frame through one generic closure: a ``struct``
format string built with ``%`` for each frame and packed into a shared
buffer, after the method's arguments went through its format-driven
``dumps`` (a BytesIO, a type ladder per argument). A publication is three
frames (method, content header, body) and an acknowledgement one, each
costing that Python bookkeeping in the thread that sends.

:class:`FrameWriter` is a drop-in for py-amqp's ``frame_writer`` (a
connection calls it with ``(type, channel, method, arguments, content)``):
it builds the frames of a call as one bytes object with three ``struct``
packs and a join, and hands it to the transport's ``write`` once, under a
lock (one call's frames are never interleaved with another thread's),
then counts the call in ``connection.bytes_sent`` as py-amqp does (its
heartbeat check reads that counter). A body larger than the connection's
frame size is cut where py-amqp cuts it. The bytes are py-amqp's for
every input (tests compare the two); a body that is neither ``bytes`` nor
``str`` goes to py-amqp's own writer, which writes or refuses it as it
always did. :func:`publish_arguments` and :func:`ack_frame` replace
``dumps('Bssbb')`` and ``dumps('Lb')`` plus the frame around it, and
:class:`WritingChannel` (before py-amqp's channel in a channel class's
bases) uses them for Basic.Publish, Basic.Ack and Basic.Reject. Figures:
see the amqp module.
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections.abc import Callable
from typing import Any

from amqp import method_framing, spec  # type: ignore[attr-defined]
from amqp.exceptions import RecoverableConnectionError  # type: ignore[attr-defined]

__all__ = [
    "FRAME_END",
    "FrameWriter",
    "WritingChannel",
    "ack_frame",
    "publish_arguments",
    "reject_frame",
]

FRAME_END = b"\xce"

# A method frame's header and its method id: type, channel, size, class, method.
_METHOD_HEAD = struct.Struct(">BHIHH")
# The end of the method frame, then a content header's frame header and
# fixed fields: end, type 2, channel, size, class, weight (0), body size.
_HEADER_HEAD = struct.Struct(">BBHIHHQ")
# The end of the content header frame, then a body frame's header.
_BODY_HEAD = struct.Struct(">BBHI")
# A frame's header alone (the body frames after the first).
_FRAME_HEAD = struct.Struct(">BHI")
# Basic.Ack and Basic.Reject whole: frame header, class, method, delivery
# tag (long long), one octet of bits, end. Arguments ``Lb``: 9 bytes.
_TAG_AND_BIT_FRAME = struct.Struct(">BHIHHQBB")
_TAG_AND_BIT_SIZE = 4 + 8 + 1
# Basic.Publish's fixed start: the ticket (short, always 0) and the
# exchange's length (octet).
_TICKET_AND_LENGTH = struct.Struct(">HB")
_U8 = struct.Struct(">B")

_METHOD = 1
_HEADER = 2
_BODY = 3
_END = 0xCE
# A frame's header and end octet.
_FRAME_OVERHEAD = 8
_BASIC_CLASS = 60
_BASIC_ACK = 80
_BASIC_REJECT = 90
# The octet two consecutive bit arguments share, the first in bit 0.
_BITS = {
    (False, False): b"\x00",
    (True, False): b"\x01",
    (False, True): b"\x02",
    (True, True): b"\x03",
}


def _short_string(value: Any) -> bytes:
    """An AMQP short string as py-amqp's ``dumps`` writes ``s`` (None and "" are empty)."""
    if type(value) is str:
        data = value.encode("utf-8", "surrogatepass")
    elif not value:
        data = b""
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
    else:
        data = value
    # struct.error beyond 255 bytes, TypeError for what is not bytes: as py-amqp.
    return _U8.pack(len(data)) + data


def publish_arguments(
    exchange: Any, routing_key: Any, mandatory: Any = False, immediate: Any = False
) -> bytes:
    """Basic.Publish's arguments (``Bssbb``) as py-amqp's ``dumps`` writes them."""
    if type(exchange) is str and type(routing_key) is str:
        exchange_data = exchange.encode("utf-8", "surrogatepass")
        key_data = routing_key.encode("utf-8", "surrogatepass")
        return b"".join(
            (
                _TICKET_AND_LENGTH.pack(0, len(exchange_data)),
                exchange_data,
                _U8.pack(len(key_data)),
                key_data,
                _BITS[bool(mandatory), bool(immediate)],
            )
        )
    return b"".join(
        (
            b"\x00\x00",
            _short_string(exchange),
            _short_string(routing_key),
            _BITS[bool(mandatory), bool(immediate)],
        )
    )


def ack_frame(channel: int, delivery_tag: int, multiple: Any = False) -> bytes:
    """The whole Basic.Ack frame (arguments ``Lb``) py-amqp writes on ``channel``.

    Raises struct.error for a tag that is not an unsigned 64-bit integer,
    as py-amqp's ``dumps`` does.
    """
    return _TAG_AND_BIT_FRAME.pack(
        _METHOD,
        channel,
        _TAG_AND_BIT_SIZE,
        _BASIC_CLASS,
        _BASIC_ACK,
        delivery_tag,
        1 if multiple else 0,
        _END,
    )


def reject_frame(channel: int, delivery_tag: int, requeue: Any) -> bytes:
    """The whole Basic.Reject frame (arguments ``Lb``) py-amqp writes on ``channel``."""
    return _TAG_AND_BIT_FRAME.pack(
        _METHOD,
        channel,
        _TAG_AND_BIT_SIZE,
        _BASIC_CLASS,
        _BASIC_REJECT,
        delivery_tag,
        1 if requeue else 0,
        _END,
    )


class FrameWriter:
    """Writes a connection's frames as py-amqp's ``frame_writer`` does, one write a call.

    Made per connected transport (py-amqp's ``frame_writer_cls(connection,
    transport)``); calling it writes one method (with its content, if any).
    Raises what the transport's ``write`` raises (py-amqp marks the
    transport disconnected on a socket error), struct.error or TypeError
    for arguments py-amqp refuses too.
    """

    def __init__(self, connection: Any, transport: Any) -> None:
        self._connection = connection
        self._write = transport.write
        self._lock = threading.Lock()
        self._generic: Any = None  # py-amqp's writer, for bodies it alone handles
        self._transport = transport

    def __call__(
        self, frame_type: int, channel: int, method_sig: Any, args: Any, content: Any
    ) -> None:
        if isinstance(args, str):
            args = args.encode("utf-8", "surrogatepass")
        with self._lock:
            if frame_type != _METHOD and not content:  # a heartbeat: an empty payload
                data = _FRAME_HEAD.pack(frame_type, channel, 0) + FRAME_END
            elif (
                frame_type != _METHOD
                or type(args) is not bytes
                or (content and not isinstance(content.body, (bytes, str)))
            ):
                # What py-amqp's callers never send (arguments not bytes, a
                # content frame of another type) or a body only it handles:
                # its writer writes or refuses it.
                self._py_amqp_writer()(frame_type, channel, method_sig, args, content)
                return
            elif content:
                body = content.body
                if isinstance(body, str):
                    # As py-amqp: the declared encoding, UTF-8 (then declared) if none.
                    encoding = content.properties.setdefault("content_encoding", "utf-8")
                    body = body.encode(encoding)
                data = self._with_content(channel, method_sig, args, content, body)
            else:
                class_id, method_id = method_sig
                data = b"".join(
                    (
                        _METHOD_HEAD.pack(_METHOD, channel, 4 + len(args), class_id, method_id),
                        args,
                        FRAME_END,
                    )
                )
            self._write(data)
            self._connection.bytes_sent += 1

    def write_frames(self, data: bytes) -> None:
        """Write frames already built (an :func:`ack_frame`), counted as one call."""
        with self._lock:
            self._write(data)
            self._connection.bytes_sent += 1

    def _py_amqp_writer(self) -> Any:
        if self._generic is None:
            # Called under our lock: py-amqp's own lock is only ever taken inside it.
            self._generic = method_framing.frame_writer(self._connection, self._transport)
        return self._generic

    def _with_content(
        self,
        channel: int,
        method_sig: Any,
        args: bytes,
        content: Any,
        body: bytes,
    ) -> bytes:
        properties = content._serialize_properties()
        class_id, method_id = method_sig
        method_head = _METHOD_HEAD.pack(_METHOD, channel, 4 + len(args), class_id, method_id)
        body_size = len(body)
        header_head = _HEADER_HEAD.pack(
            _END, _HEADER, channel, 12 + len(properties), class_id, 0, body_size
        )
        chunk_size = self._connection.frame_max - _FRAME_OVERHEAD
        total = len(args) + len(properties) + body_size + method_framing.FRAME_OVERHEAD
        if body_size == 0:
            return b"".join((method_head, args, header_head, properties, FRAME_END))
        if total <= chunk_size:
            return b"".join(
                (
                    method_head,
                    args,
                    header_head,
                    properties,
                    _BODY_HEAD.pack(_END, _BODY, channel, body_size),
                    body,
                    FRAME_END,
                )
            )
        # Larger than one frame may be: py-amqp's cut, frames of chunk_size.
        parts = [method_head, args, header_head, properties]
        view = memoryview(body)
        for start in range(0, body_size, chunk_size):
            piece = view[start : start + chunk_size]
            parts.append(_BODY_HEAD.pack(_END, _BODY, channel, len(piece)))
            parts.append(piece)
        parts.append(FRAME_END)
        return b"".join(parts)


class WritingChannel:
    """What a py-amqp channel (the class after this one) writes through a FrameWriter.

    Basic.Publish's arguments without ``dumps``, Basic.Ack and Basic.Reject
    as one packed frame; py-amqp's checks, bookkeeping and errors kept.
    """

    # The py-amqp channel's, which this class comes before.
    connection: Any
    channel_id: int
    send_method: Any

    def _basic_publish(
        self,
        msg: Any,
        exchange: str = "",
        routing_key: str = "",
        mandatory: bool = False,
        immediate: bool = False,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
        argsig: str = "Bssbb",
    ) -> None:
        """Publish ``msg`` as py-amqp does, its arguments and frames written in one pass.

        Raises RecoverableConnectionError when the connection is closed or
        the write times out, what the transport raises on a socket error
        (py-amqp's errors). With publisher confirms, py-amqp's
        ``basic_publish_confirm`` calls this, then waits for the broker.
        """
        connection = self.connection
        if not connection:
            raise RecoverableConnectionError("basic_publish: connection closed")
        capabilities = connection.client_properties.get("capabilities", {})
        if capabilities.get("connection.blocked", False):
            # As py-amqp: read a notice the broker sent (Connection.Blocked,
            # a close) before writing; a plain TCP transport first asks the
            # socket whether anything came (one poll, not a failed read).
            may_have_frames = getattr(connection.transport, "may_have_frames", None)
            if may_have_frames is None or may_have_frames():
                with contextlib.suppress(TimeoutError):
                    connection.drain_events(timeout=0)
        arguments = publish_arguments(exchange, routing_key, mandatory, immediate)
        try:
            with connection.transport.having_timeout(timeout):
                connection.frame_writer(1, self.channel_id, spec.Basic.Publish, arguments, msg)
        except TimeoutError as e:  # socket.timeout too
            # As py-amqp: a write that timed out leaves the socket unusable,
            # so it is a connection error (kombu reconnects), not a channel one.
            raise RecoverableConnectionError("basic_publish: timed out") from e

    basic_publish = _basic_publish

    def basic_ack(self, delivery_tag: int, multiple: bool = False, argsig: str = "Lb") -> None:
        """Acknowledge as py-amqp does, the frame packed in one ``struct`` call."""
        self._write_whole(ack_frame, spec_method=spec.Basic.Ack, tag=delivery_tag, bit=multiple)

    def basic_reject(self, delivery_tag: int, requeue: bool, argsig: str = "Lb") -> None:
        """Reject as py-amqp does, the frame packed in one ``struct`` call."""
        self._write_whole(
            reject_frame,
            spec_method=spec.Basic.Reject,
            tag=delivery_tag,
            bit=requeue,
        )

    def _write_whole(
        self, make: Callable[[int, int, Any], bytes], spec_method: Any, tag: int, bit: Any
    ) -> None:
        connection = self.connection
        if connection is None:
            raise RecoverableConnectionError("connection already closed")
        writer = connection.frame_writer
        if isinstance(writer, FrameWriter):
            writer.write_frames(make(self.channel_id, tag, bit))
        else:  # a writer of another kind (a test's, say): py-amqp's way
            self.send_method(spec_method, "Lb", (tag, bit))
