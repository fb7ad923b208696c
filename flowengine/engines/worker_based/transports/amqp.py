"""RabbitMQ through py-amqp, reading the socket a burst at a time.

py-amqp reads every frame with three receive calls (the 7-byte header, the
payload, the end octet) and sets and restores the socket's timeout around
each (two ioctl calls); a message is three frames (method, properties,
body): nine receive calls and six ioctls, each with its own Python
bookkeeping, for one reply. This subclass of kombu's ``amqp`` transport
(used whenever flowengine is given an ``amqp://`` or ``pyamqp://`` URL)
gives its plain TCP connections a :class:`FrameReader` that takes whatever
the socket holds, up to READ_CHUNK_BYTES, in one call and cuts the frames
out of that buffer, and leaves the timeout alone for a frame already
buffered. Measured with a backlog of 20,000 small messages on RabbitMQ:
48-54 us of CPU per consumed message with kombu's transport, 26-34 us with
this one. The bytes on the wire are py-amqp's; TLS connections
(``amqps://``, ``ssl=...``) keep py-amqp's own reader. Its channels write
a message's properties through :mod:`.amqp_codec` (the same bytes, a
third of the CPU), and its connections (TLS ones too) read each
delivery's arguments and content header through :mod:`.amqp_reading`
(py-amqp's values and errors for every input, in fewer steps): with a
backlog of 20,000 messages carrying ten headers, 53.0 [44.7-55.5] ->
44.6 [38.6-54.1] us of CPU per consumed and acknowledged message (7
interleaved runs, median [min-max]).

Its connections (TLS ones too) write frames through :mod:`.amqp_writing`
(py-amqp's bytes, counters and errors): a publication's three frames in
one pass and one write, an acknowledgement or a rejection packed whole.
Before each publication py-amqp reads what the broker may have sent (a
Connection.Blocked notice): on plain TCP one ``poll()`` first tells
whether there is anything to read, instead of a read that fails. Publishing
20,000 small messages with ten headers: 25.2 [23.5-27.3] -> 15.4
[14.9-16.1] us of CPU each (with publisher confirms 86.2 [80.1-89.7] ->
65.1 [62.1-75.5]); draining and acknowledging such a backlog 53.5
[48.9-61.3] -> 43.3 [40.4-45.4] us a message (7 interleaved runs).

TLS (``amqps://``, or ``transport_options={"ssl": {...}}`` with py-amqp's
keys ``ca_certs``, ``certfile``, ``keyfile``, ``cert_reqs``...): py-amqp
checks the server's certificate against the CA but its host name only
when told the name to expect (``server_hostname``). flowengine's
connections always tell it: the host of the URL, unless the options name
another (or bring their own ``context``), so a certificate issued for
another host is refused as a browser would refuse it.

A read with a timeout (py-amqp's ``drain_events(timeout)``: a consume
loop's wait, and the poll for broker notices py-amqp makes before every
publication) leaves the socket's timeout alone too: py-amqp switches the
socket to the timeout and back (four ``fcntl`` calls, letting go of the
interpreter lock twice), and Python then polls before each receive anyway.
Here the reader waits with ``poll()`` for at most the timeout, then
receives without blocking: two system calls instead of six (one instead
of five when it must not wait), the same result (a timeout when nothing
came).

Loading this module also makes py-amqp read a message property that is not
UTF-8 (AMQP's short strings are octets: any client may send them) as bytes,
as py-amqp already reads such table values, instead of raising while it
parses the frame: see :func:`tolerate_undecodable_properties`.
"""

from __future__ import annotations

import contextlib
import errno
import math
import select
import socket
import struct
from collections.abc import Callable
from typing import Any

from amqp import transport as amqp_transport
from amqp.exceptions import UnexpectedFrame
from kombu.transport import pyamqp

from flowengine.engines.worker_based.transports import amqp_codec, amqp_reading, amqp_writing
from flowengine.engines.worker_based.transports.amqp_reading import (
    tolerate_undecodable_properties,  # applied when amqp_reading is loaded
)

__all__ = [
    "READ_CHUNK_BYTES",
    "Channel",
    "FrameReader",
    "SSLTransport",
    "Transport",
    "checking_host_name",
    "tolerate_undecodable_properties",
]

#: Most bytes one receive call asks for: a burst of replies (hundreds of
#: small messages) in one call, while a buffer no bigger than this plus one
#: frame stays in memory per connection.
READ_CHUNK_BYTES = 65536

# type (octet), channel (short), payload size (long).
_FRAME_HEADER = struct.Struct(">BHI")
_FRAME_END = 0xCE
# Bytes around a frame's payload: the header and the end octet.
_FRAME_OVERHEAD = _FRAME_HEADER.size + 1


class FrameReader:
    """Cuts AMQP frames out of what a socket receive function returns.

    A frame is consumed only once it is whole, so a receive that times out
    midway (py-amqp polls with short timeouts) loses nothing: the next
    call goes on from the bytes already buffered. Raises TimeoutError
    (socket.timeout) when no whole frame arrived in time (or a non-blocking
    socket has none yet), OSError when the peer closed the connection,
    UnexpectedFrame for a frame that does not end with the end octet.
    """

    def __init__(self, recv: Callable[[int], bytes], chunk_bytes: int = READ_CHUNK_BYTES) -> None:
        self._recv = recv
        self._chunk_bytes = chunk_bytes
        self._buffer = bytearray()
        self._start = 0  # where the unread bytes begin in _buffer

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return len(self._buffer) - self._start

    @property
    def has_frame(self) -> bool:
        """True when the next read_frame() needs no receive call."""
        available = len(self._buffer) - self._start
        if available < _FRAME_HEADER.size:
            return False
        size: int = _FRAME_HEADER.unpack_from(self._buffer, self._start)[2]
        return available >= size + _FRAME_OVERHEAD

    def read_frame(self) -> tuple[int, int, bytes]:
        """The next frame as ``(type, channel, payload)``, receiving as needed."""
        buffer, start = self._buffer, self._start
        needed = _FRAME_HEADER.size
        while True:
            available = len(buffer) - start
            if available >= _FRAME_HEADER.size:
                frame_type, channel, size = _FRAME_HEADER.unpack_from(buffer, start)
                needed = size + _FRAME_OVERHEAD
                if available >= needed:
                    break
            self._receive(needed - available)
            start = self._start  # _receive may have moved the unread bytes
        end = start + needed
        payload = bytes(buffer[start + _FRAME_HEADER.size : end - 1])
        frame_end = buffer[end - 1]
        if end == len(buffer):
            buffer.clear()
            self._start = 0
        else:
            self._start = end
        if frame_end != _FRAME_END:
            raise UnexpectedFrame(
                f"Received frame_end {frame_end:#04x} while expecting {_FRAME_END:#04x}"
            )
        return frame_type, channel, payload

    def _receive(self, missing: int) -> None:
        """Append one receive's bytes (at least one) to the buffer."""
        if self._start:
            # Drop what was read, once, before growing: the buffer stays
            # about one chunk long however many frames pass through it.
            del self._buffer[: self._start]
            self._start = 0
        while True:
            try:
                data = self._recv(max(missing, self._chunk_bytes))
            except InterruptedError:
                continue
            except BlockingIOError as e:
                # A non-blocking poll (timeout 0) with nothing to read.
                raise TimeoutError() from e
            break
        if not data:
            raise OSError(errno.ECONNRESET, "Server unexpectedly closed connection")
        self._buffer += data


#: Longest wait poll() takes (ms): a C int.
_POLL_MAX_MS = 2**31 - 1


class _TCPTransport(amqp_transport.TCPTransport):
    """py-amqp's TCP transport reading frames through a FrameReader."""

    def _setup_transport(self) -> None:
        super()._setup_transport()
        self._frames = FrameReader(self._receive)
        self._readable = select.poll()
        self._readable.register(self.sock, select.POLLIN)
        # How long the read under way may wait (s): None blocks (or keeps
        # the socket's own timeout); 0 takes only what already arrived.
        self._wait_s: float | None = None

    def _receive(self, size: int) -> bytes:
        """One receive for the FrameReader, waiting at most ``_wait_s``."""
        wait_s = self._wait_s
        if wait_s is None:
            return self.sock.recv(size)
        if wait_s > 0 and not self._readable.poll(min(math.ceil(wait_s * 1000), _POLL_MAX_MS)):
            raise TimeoutError()  # socket.timeout, as py-amqp's reads raise
        # Readable, or an error or hang-up the receive reports.
        return self.sock.recv(size, socket.MSG_DONTWAIT)

    def having_timeout(self, timeout: float | None) -> Any:
        """Wait at most ``timeout`` (s) for the next frame without touching the socket's timeout.

        Nothing to arrange when no receive will happen (the second and
        third frames of a message are usually buffered already); py-amqp's
        own way (the socket's timeout set and restored) only while the
        socket has a timeout of its own (as when connecting).
        """
        if timeout is None or self._frames.has_frame:
            return contextlib.nullcontext(self.sock)
        if self.sock.gettimeout() is not None:
            return super().having_timeout(timeout)
        return _Waiting(self, timeout)

    def may_have_frames(self) -> bool:
        """False when a read now would find nothing (no frame buffered, nothing arrived)."""
        return self._frames.has_frame or bool(self._readable.poll(0))

    def read_frame(self, unpack: Any = None) -> tuple[int, int, bytes]:
        try:
            return self._frames.read_frame()
        except TimeoutError:  # socket.timeout: nothing lost, try again later
            raise
        except OSError as e:
            # As py-amqp: a real error (not "try again") ends the connection.
            if e.errno not in amqp_transport._UNAVAIL:
                self.connected = False
            raise


class _Waiting:
    """Context of one read that waits at most ``timeout`` s (see _TCPTransport._receive)."""

    __slots__ = ("_transport", "_timeout")

    def __init__(self, transport: _TCPTransport, timeout: float) -> None:
        self._transport = transport
        self._timeout = timeout

    def __enter__(self) -> Any:
        self._transport._wait_s = self._timeout
        return self._transport.sock

    def __exit__(self, *exc_info: object) -> None:
        self._transport._wait_s = None


def checking_host_name(ssl: Any, host: str) -> dict[str, Any]:
    """py-amqp's TLS options ``ssl`` (True or a dict) that also check the server's name.

    ``host`` is the ``host[:port]`` connected to; its host part is the name
    expected unless ``ssl`` names one (``server_hostname``) or brings its
    own ``context`` (whose ``check_hostname`` then decides).
    """
    options: dict[str, Any] = dict(ssl) if isinstance(ssl, dict) else {}
    if "context" not in options and not options.get("server_hostname"):
        name: str = amqp_transport.to_host_port(host)[0]  # type: ignore[attr-defined]
        options["server_hostname"] = name
    return options


class Channel(amqp_writing.WritingChannel, pyamqp.Channel):
    """kombu's py-amqp channel whose messages write their properties faster (amqp_codec).

    It also reads Basic.Deliver's arguments through :mod:`.amqp_reading`,
    and writes Basic.Publish, Basic.Ack and Basic.Reject through
    :mod:`.amqp_writing` (py-amqp's bytes, checks and errors).
    """

    def dispatch_method(self, method_sig: Any, payload: bytes, content: Any) -> Any:
        """py-amqp's dispatch, a delivery's arguments read by amqp_reading."""
        if method_sig != amqp_reading.BASIC_DELIVER or self.is_closing:
            return super().dispatch_method(method_sig, payload, content)
        if content is not None and self.auto_decode and hasattr(content, "content_encoding"):
            # As py-amqp: a body with a declared encoding becomes text when it can.
            with contextlib.suppress(Exception):
                content.body = content.body.decode(content.content_encoding)
        listener = self._callbacks.get(method_sig)
        one_shot = self._pending.pop(method_sig, None)
        if listener is None and one_shot is None:
            return None
        args = amqp_reading.decode_deliver_arguments(payload)
        args.append(content)
        if listener is not None:
            listener(*args)
        if one_shot:
            one_shot(method_sig, *args)
        return None

    def prepare_message(
        self,
        body: Any,
        priority: int | None = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        headers: Any = None,
        properties: Any = None,
        _Message: Any = amqp_codec.FastPropertiesMessage,  # noqa: N803  (kombu's name)
    ) -> Any:
        return super().prepare_message(  # type: ignore[no-untyped-call]
            body, priority, content_type, content_encoding, headers, properties, _Message
        )


class Connection(pyamqp.Connection):
    """kombu's py-amqp connection with plain TCP read by a FrameReader.

    Its channels write message properties through :mod:`.amqp_codec`, and
    it reads deliveries through :mod:`.amqp_reading` (TLS connections too).
    """

    Channel = Channel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Frames assembled into messages whose header amqp_reading reads.
        self.frame_handler_cls = amqp_reading.frame_handler
        # Frames written a call at a time (amqp_writing).
        self.frame_writer_cls = amqp_writing.FrameWriter

    def Transport(
        self,
        host: str,
        connect_timeout: float | None,
        ssl: Any = False,  # noqa: N802
        read_timeout: float | None = None,
        write_timeout: float | None = None,
        socket_settings: Any = None,
        **kwargs: Any,
    ) -> Any:
        if ssl:
            return super().Transport(
                host,
                connect_timeout,
                ssl=checking_host_name(ssl, host),
                read_timeout=read_timeout,
                write_timeout=write_timeout,
                socket_settings=socket_settings,
                **kwargs,
            )
        return _TCPTransport(
            host,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            socket_settings=socket_settings,
            **kwargs,
        )


class Transport(pyamqp.Transport):
    """kombu's ``amqp`` transport whose connections read a burst per receive call."""

    Connection = Connection


class SSLTransport(Transport):
    """The same over TLS (``amqps://``): port 5671 by default, the server's name checked."""

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        if not client.ssl:  # amqps:// without options: TLS with the system's CAs
            client.ssl = True
