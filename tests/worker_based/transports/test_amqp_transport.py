"""flowengine's AMQP transport reads frames a burst at a time and loses none.

The FrameReader is driven by a scripted receive function (every way a
stream can be cut, timeouts midway, a closed peer, a corrupt frame); the
transport itself against a real rabbitmq-server: many small and some large
messages arrive whole, in order, with far fewer receive calls than frames,
and a read that times out leaves the connection usable.
"""

from __future__ import annotations

import os
import socket
import struct
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import amqp.transport
import kombu
import pytest
from amqp.exceptions import UnexpectedFrame

from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.transports import amqp as amqp_transport


def frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


class Script:
    """A receive function returning scripted pieces: bytes, or an exception to raise."""

    def __init__(self, pieces: Iterable[bytes | BaseException]) -> None:
        self.pieces = list(pieces)
        self.calls = 0

    def __call__(self, size: int) -> bytes:
        self.calls += 1
        piece = self.pieces.pop(0)
        if isinstance(piece, BaseException):
            raise piece
        assert len(piece) <= size, "the script gives more than was asked for"
        return piece


FRAMES = [
    frame(1, 1, b"method"),
    frame(2, 1, b"header" * 3),
    frame(3, 1, b"x" * 500),
    frame(8, 0, b""),
]
WANTED = [(1, 1, b"method"), (2, 1, b"header" * 3), (3, 1, b"x" * 500), (8, 0, b"")]


def read_all(reader: amqp_transport.FrameReader, count: int) -> list[tuple[int, int, bytes]]:
    return [reader.read_frame() for _ in range(count)]


def test_frames_sent_in_one_burst_are_read_with_one_call():
    script = Script([b"".join(FRAMES)])
    reader = amqp_transport.FrameReader(script)
    assert read_all(reader, len(FRAMES)) == WANTED
    assert script.calls == 1
    assert reader.buffered == 0


@pytest.mark.parametrize("piece_bytes", [1, 2, 3, 7, 8, 13, 100])
def test_frames_cut_anywhere_arrive_whole(piece_bytes):
    stream = b"".join(FRAMES)
    pieces = [stream[i : i + piece_bytes] for i in range(0, len(stream), piece_bytes)]
    reader = amqp_transport.FrameReader(Script(pieces))
    assert read_all(reader, len(FRAMES)) == WANTED


def test_a_timeout_midway_loses_nothing_and_the_next_read_goes_on():
    stream = b"".join(FRAMES)
    cut = 7 + 3  # inside the first frame's payload
    script = Script([stream[:cut], TimeoutError("timed out"), stream[cut:]])
    reader = amqp_transport.FrameReader(script)
    with pytest.raises(socket.timeout):
        reader.read_frame()
    assert reader.buffered == cut
    assert read_all(reader, len(FRAMES)) == WANTED


def test_a_non_blocking_poll_with_nothing_to_read_is_a_timeout():
    reader = amqp_transport.FrameReader(Script([BlockingIOError(11, "again"), FRAMES[0]]))
    with pytest.raises(socket.timeout):
        reader.read_frame()
    assert reader.read_frame() == WANTED[0]


def test_an_interrupted_receive_is_retried():
    reader = amqp_transport.FrameReader(Script([InterruptedError(), FRAMES[0]]))
    assert reader.read_frame() == WANTED[0]


def test_a_closed_peer_is_an_error_not_an_empty_frame():
    reader = amqp_transport.FrameReader(Script([FRAMES[0][:5], b""]))
    with pytest.raises(OSError, match="closed"):
        reader.read_frame()


def test_a_frame_without_its_end_octet_is_refused():
    reader = amqp_transport.FrameReader(Script([frame(1, 1, b"abc", end=0x00) + FRAMES[1]]))
    with pytest.raises(UnexpectedFrame, match="0x00"):
        reader.read_frame()


def test_the_buffer_stays_about_one_chunk_long():
    # Given a stream of many frames received in small chunks,
    many = [frame(3, 1, os.urandom(40)) for _ in range(1000)]
    stream = b"".join(many)
    chunk = 256
    pieces = [stream[i : i + chunk] for i in range(0, len(stream), chunk)]
    reader = amqp_transport.FrameReader(Script(pieces), chunk_bytes=chunk)
    # when they are read one by one,
    largest = 0
    for expected in many:
        assert reader.read_frame()[2] == expected[7:-1]
        largest = max(largest, len(reader._buffer))
    # then what was read is dropped as it goes: never more than a chunk and a frame.
    assert largest <= 2 * chunk


def test_a_frame_larger_than_a_chunk_is_received_whole():
    big = frame(3, 1, os.urandom(10_000))
    script = Script([big[:64], big[64:]])  # a chunk, then all that is missing in one call
    reader = amqp_transport.FrameReader(script, chunk_bytes=64)
    assert reader.read_frame() == (3, 1, big[7:-1])
    assert script.calls == 2


# --- against a real rabbitmq-server ---


def counting_recv(conn: kombu.Connection) -> Callable[[], int]:
    """Count the receive calls of a connected connection's frame reader."""
    reader = conn.connection.transport._frames
    recv, calls = reader._recv, [0]

    def counted(size: int) -> bytes:
        calls[0] += 1
        return recv(size)

    reader._recv = counted
    return lambda: calls[0]


def counting_timeouts(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the times py-amqp's socket timeout handling runs around a read."""
    original, calls = amqp.transport.TCPTransport.having_timeout, [0]

    def counted(self: Any, timeout: float | None) -> Any:
        calls[0] += 1
        return original(self, timeout)

    monkeypatch.setattr(amqp.transport.TCPTransport, "having_timeout", counted)
    return lambda: calls[0]


def test_has_frame_says_whether_a_read_needs_the_socket():
    script = Script([FRAMES[0] + FRAMES[1][:4], FRAMES[1][4:]])
    reader = amqp_transport.FrameReader(script)
    assert not reader.has_frame  # nothing received yet
    reader.read_frame()
    assert not reader.has_frame  # only part of the next one
    reader.read_frame()
    assert not reader.has_frame and script.calls == 2
    reader = amqp_transport.FrameReader(Script([FRAMES[0] + FRAMES[1]]))
    reader.read_frame()
    assert reader.has_frame


@pytest.fixture
def socket_transport():
    """A flowengine TCP transport on one end of a socket pair, and the other end."""
    ours, theirs = socket.socketpair()
    transport = amqp_transport._TCPTransport.__new__(amqp_transport._TCPTransport)
    transport.sock = ours
    transport._setup_transport()
    yield transport, theirs
    ours.close()
    theirs.close()


def read_waiting(transport: Any, timeout: float | None) -> tuple[int, int, bytes]:
    with transport.having_timeout(timeout):
        return transport.read_frame()


@pytest.mark.parametrize("timeout", [0, 0.01])
def test_a_read_with_a_timeout_leaves_the_socket_timeout_alone(
    socket_transport, monkeypatch, timeout
):
    transport, peer = socket_transport
    timeouts_set = counting_timeouts(monkeypatch)
    # Nothing arrived: a timeout, as py-amqp's reads raise,
    with pytest.raises(socket.timeout):
        read_waiting(transport, timeout)
    # and what arrives next is read whole, in order,
    peer.sendall(FRAMES[0] + FRAMES[1])
    assert read_waiting(transport, 5 if timeout else None) == WANTED[0]
    assert read_waiting(transport, timeout) == WANTED[1]
    # the socket blocking as it was, its timeout never set (py-amqp's way not taken).
    assert transport.sock.gettimeout() is None
    assert timeouts_set() == 0


def test_a_frame_cut_in_two_waits_for_its_second_part(socket_transport):
    transport, peer = socket_transport
    peer.sendall(FRAMES[2][:100])
    with pytest.raises(socket.timeout):
        read_waiting(transport, 0)
    peer.sendall(FRAMES[2][100:])
    assert read_waiting(transport, 5) == WANTED[2]


def test_a_peer_gone_while_waiting_is_an_error_not_a_timeout(socket_transport):
    transport, peer = socket_transport
    peer.close()
    with pytest.raises(OSError) as info:
        read_waiting(transport, 5)
    assert not isinstance(info.value, socket.timeout)


def test_a_socket_with_a_timeout_of_its_own_keeps_py_amqps_way(socket_transport, monkeypatch):
    transport, peer = socket_transport
    transport.sock.settimeout(30)  # as while connecting
    timeouts_set = counting_timeouts(monkeypatch)
    with pytest.raises(socket.timeout):
        read_waiting(transport, 0)
    assert timeouts_set() == 1 and transport.sock.gettimeout() == 30


@pytest.mark.broker
def test_amqp_urls_get_the_burst_reader(amqp_url):
    with transports.connection(amqp_url, None) as conn:
        conn.connect()
        assert isinstance(conn.transport, amqp_transport.Transport)
        assert isinstance(conn.connection.transport._frames, amqp_transport.FrameReader)
        assert transports.public_uri(conn.as_uri()).startswith("amqp://")


@pytest.mark.broker
def test_a_backlog_arrives_whole_and_in_order_with_few_receive_calls(amqp_url, monkeypatch):
    # Given 2,000 small messages and 3 large ones (several frames each) in a queue,
    name = f"burst-{uuid.uuid4().hex[:8]}"
    large = {i: os.urandom(300_000).hex() for i in (10, 1000, 1999)}
    with transports.connection(amqp_url, None) as conn:
        queue = kombu.Queue(
            name, kombu.Exchange(name, type="direct"), routing_key=name, auto_delete=True
        )
        producer = kombu.Producer(conn.channel(), exchange=queue.exchange)
        queue(producer.channel).declare()
        for i in range(2000):
            producer.publish(
                {"i": i, "data": large.get(i, "small")},
                routing_key=name,
                headers={"attempt": 1, "request_id": uuid.uuid4().hex},
            )
        received: list[dict] = []
        calls = counting_recv(conn)
        timeouts_set = counting_timeouts(monkeypatch)
        # when they are consumed, each with a timeout,
        with conn.Consumer(queue, callbacks=[lambda body, m: received.append(body)], no_ack=True):
            while len(received) < 2000:
                conn.drain_events(timeout=10)
        # then each arrives once, in order, whole,
        assert [body["i"] for body in received] == list(range(2000))
        assert all(body["data"] == large.get(body["i"], "small") for body in received)
        # with far fewer receive calls than the 6,000+ frames (py-amqp: 3 per
        # frame), and the socket's timeout never set (py-amqp: twice per read).
        assert calls() < 2000
        assert timeouts_set() == 0


@pytest.mark.broker
def test_a_read_that_times_out_leaves_the_connection_usable(amqp_url, monkeypatch):
    name = f"quiet-{uuid.uuid4().hex[:8]}"
    timeouts_set = counting_timeouts(monkeypatch)
    with transports.connection(amqp_url, None) as conn:
        queue = kombu.Queue(
            name, kombu.Exchange(name, type="direct"), routing_key=name, auto_delete=True
        )
        received: list[dict] = []
        with conn.Consumer(queue, callbacks=[lambda body, m: received.append(body)], no_ack=True):
            for timeout in (0, 0.05):
                with pytest.raises(socket.timeout):
                    conn.drain_events(timeout=timeout)
            kombu.Producer(conn.channel(), exchange=queue.exchange).publish(
                {"after": "timeouts"}, routing_key=name
            )
            conn.drain_events(timeout=10)
        assert received == [{"after": "timeouts"}]
        # Waits, and py-amqp's poll for broker notices before the publication,
        # all without setting the socket's timeout (connecting sets it once).
        assert timeouts_set() <= 1
