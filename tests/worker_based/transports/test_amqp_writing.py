"""flowengine's AMQP frame writer puts on the wire exactly what py-amqp would.

Each call (a publication with its properties and a body of any size, a
method alone, a heartbeat, an acknowledgement) is written both ways
(py-amqp's ``frame_writer`` and :class:`amqp_writing.FrameWriter`) into a
sink and the bytes, the ``bytes_sent`` count and the error (if any)
compared, on generated inputs. Then against a real rabbitmq-server: what a
flowengine connection publishes arrives intact (big bodies too), publisher
confirms still wait for the broker, acknowledgements and rejections
settle their messages, a broker's frame waiting on the socket is read
before a publication as py-amqp reads it, and a socket error leaves the
connection as py-amqp leaves it.
"""

from __future__ import annotations

import errno
import select
import struct
import uuid
from typing import Any

import amqp
import kombu
import pytest
from amqp import method_framing, spec
from amqp.exceptions import NotFound, RecoverableConnectionError
from amqp.serialization import dumps
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.transports import amqp_codec, amqp_writing
from tests.worker_based.amqp_samples import REQUEST_HEADERS, REQUEST_PROPERTIES


class _Sink:
    """A transport's ``write``, keeping what it was given."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.data = bytearray()
        self.fail = fail

    def write(self, data: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.data += data


class _Connection:
    """What a frame writer reads and counts on its connection."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self.bytes_sent = 0


def _write(make: Any, frame_max: int, *call: Any) -> tuple[bytes, int, str]:
    """What ``make``'s writer sends for one call: bytes, calls counted, error type."""
    connection, sink = _Connection(frame_max), _Sink()
    writer = make(connection, sink)
    try:
        writer(*call)
        error = ""
    except Exception as e:  # compared with py-amqp's, whatever it is
        error = type(e).__name__
    return bytes(sink.data), connection.bytes_sent, error


def _message(body: Any, properties: dict[str, Any], kind: type = amqp.Message) -> Any:
    return kind(body, **properties)


def both_ways(
    frame_max: int, frame_type: int, channel: int, method_sig: Any, args: Any, content: Any
) -> None:
    """Assert both writers send the same for one call (content built afresh each way)."""
    theirs_content = content() if content else None
    ours_content = content() if content else None
    theirs = _write(
        method_framing.frame_writer,
        frame_max,
        frame_type,
        channel,
        method_sig,
        args,
        theirs_content,
    )
    ours = _write(
        amqp_writing.FrameWriter, frame_max, frame_type, channel, method_sig, args, ours_content
    )
    assert ours == theirs
    if content:  # the properties the writers leave behind (content_encoding set for text)
        assert ours_content.properties == theirs_content.properties


def test_a_request_is_written_as_py_amqp_writes_it() -> None:
    properties = dict(REQUEST_PROPERTIES)
    args = dumps("Bssbb", (0, "flowengine-exchange", "topic-1", False, False))
    for kind in (amqp.Message, amqp_codec.FastPropertiesMessage):
        both_ways(
            131072,
            1,
            1,
            spec.Basic.Publish,
            args,
            lambda kind=kind: _message(b'{"a": 1}', properties, kind),
        )


header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children)
    ),
    max_leaves=8,
)

properties = st.fixed_dictionaries(
    {},
    optional={
        "content_type": st.sampled_from(["application/json", "text/plain", ""]),
        "content_encoding": st.sampled_from(["utf-8", "latin-1"]),
        "application_headers": st.dictionaries(st.text(max_size=10), header_values, max_size=6),
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 9),
        "correlation_id": st.text(max_size=40),
        "reply_to": st.text(max_size=40) | st.binary(max_size=40),
        "type": st.sampled_from(["REQUEST", "RESPONSE", "NOTIFY"]),
        "timestamp": st.integers(0, 2**40),
    },
)


@st.composite
def bodies(draw: st.DrawFn, frame_max: int) -> Any:
    """A body up to three frames long, often near a frame's edge: bytes or text."""
    size = draw(
        st.integers(0, 3 * frame_max)
        | st.integers(-48, 8).map(lambda d: max(0, frame_max + d))
        | st.integers(0, 4)
    )
    data = draw(st.randoms(use_true_random=False)).randbytes(size)
    if draw(st.booleans()):
        return data
    return data.decode("latin-1")  # text: encoded by the content_encoding, as py-amqp does


@st.composite
def publications(draw: st.DrawFn) -> tuple[Any, ...]:
    frame_max = draw(st.sampled_from([64, 100, 4096, 131072]) | st.integers(48, 5000))
    body = draw(bodies(min(frame_max, 20000)))
    props = draw(properties)
    args = draw(
        st.builds(
            lambda e, k, m, i: dumps("Bssbb", (0, e, k, m, i)),
            st.text(max_size=20),
            st.text(max_size=40),
            st.booleans(),
            st.booleans(),
        )
        | st.binary(max_size=40)
        | st.text(max_size=10)
    )
    kind = draw(st.sampled_from([amqp.Message, amqp_codec.FastPropertiesMessage]))
    channel = draw(st.integers(0, 65535))
    return frame_max, 1, channel, spec.Basic.Publish, args, lambda: _message(body, props, kind)


@settings(max_examples=400, deadline=None)
@given(publications())
def test_publications_are_written_as_py_amqp_writes_them(call: tuple[Any, ...]) -> None:
    both_ways(*call)


@pytest.mark.parametrize(
    "size", [0, 1, 4096 - 48, 4096 - 47, 4096 - 8, 4096, 3 * 4088, 3 * 4088 + 1]
)
def test_bodies_at_a_frame_s_edge_are_cut_where_py_amqp_cuts_them(size: int) -> None:
    body = bytes(range(256)) * (size // 256 + 1)
    both_ways(
        4096, 1, 5, spec.Basic.Publish, b"\x00\x00\x00\x00\x00", lambda: amqp.Message(body[:size])
    )


@given(
    st.integers(-1, 70000),
    st.tuples(st.integers(-1, 70000), st.integers(0, 65535)),
    st.binary(max_size=64) | st.text(max_size=16) | st.none(),
)
@example(0, (60, 80), b"")
def test_methods_without_content_are_written_as_py_amqp_writes_them(
    channel: int, method_sig: tuple[int, int], args: Any
) -> None:
    both_ways(131072, 1, channel, method_sig, args, None)


def test_a_heartbeat_is_written_as_py_amqp_writes_it() -> None:
    both_ways(131072, 8, 0, None, None, None)


@pytest.mark.parametrize(
    "body",
    [bytearray(b"abc"), memoryview(b"abc"), None, 17, "caf\u00e9\udcff"],
    ids=["bytearray", "memoryview", "none", "int", "unencodable"],
)
def test_bodies_py_amqp_alone_handles_are_written_or_refused_as_it_does(body: Any) -> None:
    both_ways(4096, 1, 1, spec.Basic.Publish, b"", lambda: amqp.Message(body))


def test_odd_properties_are_written_or_refused_as_py_amqp_does() -> None:
    for props in (
        {"content_encoding": "no-such-codec"},
        {"content_encoding": None},
        {"priority": 300},
        {"type": "x" * 300},
    ):
        both_ways(
            4096, 1, 1, spec.Basic.Publish, b"", lambda props=props: amqp.Message("é", **props)
        )


def test_a_failed_write_raises_and_is_not_counted() -> None:
    connection, sink = _Connection(4096), _Sink(fail=BrokenPipeError())
    writer = amqp_writing.FrameWriter(connection, sink)
    with pytest.raises(BrokenPipeError):
        writer(1, 1, spec.Basic.Publish, b"", amqp.Message(b"x"))
    with pytest.raises(BrokenPipeError):
        writer.write_frames(amqp_writing.ack_frame(1, 1))
    assert connection.bytes_sent == 0


def test_each_call_is_one_write_and_one_count() -> None:
    connection = _Connection(4096)
    writes: list[bytes] = []
    writer = amqp_writing.FrameWriter(connection, type("T", (), {"write": writes.append})())
    writer(1, 1, spec.Basic.Publish, b"", amqp.Message(b"y" * 10000))  # three body frames
    writer.write_frames(amqp_writing.ack_frame(1, 7))
    assert len(writes) == 2
    assert connection.bytes_sent == 2


short_strings = (
    st.text(max_size=300)
    | st.binary(max_size=300)
    | st.sampled_from([None, "", b"", 0, False, 1, 2.5])  # py-amqp writes a falsy one as ""
)
bits = st.booleans() | st.none() | st.integers(0, 3)


@given(short_strings, short_strings, bits, bits)
@example("", "", False, False)
@example("ex\udcff", b"\xff", 1, None)
def test_publish_arguments_are_py_amqp_s(
    exchange: Any, routing_key: Any, mandatory: Any, immediate: Any
) -> None:
    def outcome(write: Any) -> tuple[bytes | None, str]:
        try:
            return write(), ""
        except Exception as e:  # compared with py-amqp's, whatever it is
            return None, type(e).__name__

    ours = outcome(
        lambda: amqp_writing.publish_arguments(exchange, routing_key, mandatory, immediate)
    )
    theirs = outcome(lambda: dumps("Bssbb", (0, exchange, routing_key, mandatory, immediate)))
    assert ours == theirs


@given(st.integers(0, 65535), st.integers(-2, 2**64 + 2), bits)
@example(1, 2**64 - 1, True)
def test_ack_and_reject_frames_are_py_amqp_s(channel: int, tag: int, bit: Any) -> None:
    for make, method_sig in (
        (amqp_writing.ack_frame, spec.Basic.Ack),
        (amqp_writing.reject_frame, spec.Basic.Reject),
    ):
        try:
            args = dumps("Lb", (tag, bit))
        except struct.error:
            with pytest.raises(struct.error):
                make(channel, tag, bit)
            continue
        theirs = _write(method_framing.frame_writer, 131072, 1, channel, method_sig, args, None)
        assert (make(channel, tag, bit), 1, "") == theirs


# Against a real rabbitmq-server.


def _queue(channel: Any) -> str:
    name = f"writing-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue=name, auto_delete=False)
    return name


def _read_back(amqp_url: str, queue: str, count: int) -> list[Any]:
    """``count`` messages of ``queue`` as plain py-amqp reads them (kombu's own transport)."""
    received: list[Any] = []
    with kombu.Connection(amqp_url) as plain:
        assert not isinstance(plain.transport, transports.amqp.Transport)
        plain.default_channel.basic_consume(queue, callback=received.append, no_ack=True)
        while len(received) < count:
            plain.drain_events(timeout=10)
    return received


def _message_count(amqp_url: str, queue: str) -> int:
    with kombu.Connection(amqp_url) as plain:
        return int(plain.default_channel.queue_declare(queue=queue, passive=True).message_count)


@pytest.mark.broker
def test_what_a_connection_publishes_arrives_intact(amqp_url: str) -> None:
    # Given a flowengine amqp:// connection, writing through a FrameWriter,
    with transports.connection(amqp_url, None) as conn:
        channel = conn.channel()
        assert isinstance(conn.connection.frame_writer, amqp_writing.FrameWriter)
        queue = _queue(channel)
        frame_max = conn.connection.frame_max
        big = bytes(range(256)) * (3 * frame_max // 256 + 7)  # four body frames
        text = "caf\u00e9 \u2603 " * 10
        sent_before = conn.connection.bytes_sent
        # when it publishes a request, a body of several frames, an empty
        # one and a text one,
        for body, headers in (
            (b'{"a": 1}', REQUEST_HEADERS),
            (big, {"n": 1}),
            (b"", {}),
            (text, {}),
        ):
            message = channel.prepare_message(
                body,
                3,
                "application/json",
                "utf-8" if isinstance(body, str) else "binary",
                headers,
                {"correlation_id": "c-1", "reply_to": "r-1", "type": "REQUEST"},
            )
            channel.basic_publish(message, exchange="", routing_key=queue)
        # (each publication counted once, as py-amqp counts it for heartbeats)
        assert conn.connection.bytes_sent == sent_before + 4
        # then plain py-amqp reads back what was sent.
        request, large, empty, encoded = _read_back(amqp_url, queue, 4)
        assert request.headers == REQUEST_HEADERS
        assert request.body == b'{"a": 1}'
        assert request.properties["correlation_id"] == "c-1"
        assert request.properties["reply_to"] == "r-1"
        assert request.properties["type"] == "REQUEST"
        assert request.properties["priority"] == 3
        assert large.body == big and large.headers == {"n": 1}
        assert len(empty.body) == 0  # (py-amqp reads a message without body frames as "")
        assert encoded.content_encoding == "utf-8"
        assert encoded.body == text  # decoded by py-amqp from its declared encoding
        channel.queue_delete(queue)


@pytest.mark.broker
def test_confirms_still_wait_for_the_broker(amqp_url: str) -> None:
    # Given a connection with publisher confirms,
    with transports.connection(amqp_url, None, {"confirm_publish": True}) as conn:
        channel = conn.channel()
        queue = _queue(channel)
        # when it publishes to a queue, it returns once the broker took it
        channel.basic_publish(channel.prepare_message(b"kept"), exchange="", routing_key=queue)
        assert _message_count(amqp_url, queue) == 1
        # and a publication the broker refuses (no such exchange) raises
        # while the publisher waits for the broker's answer.
        other = conn.channel()
        with pytest.raises(NotFound):
            other.basic_publish(
                other.prepare_message(b"lost"), exchange=f"missing-{queue}", routing_key=queue
            )
        channel.queue_delete(queue)


@pytest.mark.broker
def test_acknowledgements_and_rejections_settle_their_messages(amqp_url: str) -> None:
    # Given four messages on a queue, delivered to a flowengine connection,
    with transports.connection(amqp_url, None) as conn:
        channel = conn.channel()
        queue = _queue(channel)
        for i in range(4):
            channel.basic_publish(
                channel.prepare_message(str(i).encode()), exchange="", routing_key=queue
            )
        received: list[Any] = []
        channel.basic_consume(queue, callback=received.append)
        while len(received) < 4:
            conn.drain_events(timeout=10)
        first, second, third, fourth = received
        # when it acknowledges two (the second with ``multiple``), rejects the
        # third for good and the fourth back to the queue,
        sent_before = conn.connection.bytes_sent
        channel.basic_ack(first.delivery_tag)
        channel.basic_ack(second.delivery_tag, multiple=True)
        channel.basic_reject(third.delivery_tag, requeue=False)
        channel.basic_reject(fourth.delivery_tag, requeue=True)
        assert conn.connection.bytes_sent == sent_before + 4
        # then only the fourth comes back, redelivered (read on a fresh
        # connection once this one closed: the broker handled its frames in order).
    (back,) = _read_back(amqp_url, queue, 1)
    assert back.body == b"3"
    assert back.delivery_info["redelivered"]
    assert _message_count(amqp_url, queue) == 0


@pytest.mark.broker
def test_a_frame_waiting_on_the_socket_is_read_before_a_publication(amqp_url: str) -> None:
    # Given a flowengine connection consuming a queue, and a message for it
    # waiting (unread) on its socket,
    with transports.connection(amqp_url, None) as conn:
        channel = conn.channel()
        queue = _queue(channel)
        received: list[Any] = []
        channel.basic_consume(queue, callback=received.append, no_ack=True)
        with kombu.Connection(amqp_url) as plain:
            plain.default_channel.basic_publish(
                amqp.Message(b"waiting"), exchange="", routing_key=queue
            )
        sock = conn.connection.transport.sock
        # when it publishes (each time once the socket has something to read),
        for _ in range(50):
            assert select.select([sock], [], [], 10)[0], "the delivery never came"
            channel.basic_publish(channel.prepare_message(b"x"), exchange="", routing_key="")
            if received:
                break
        # then the delivery was read by the publication's look at the socket,
        # as py-amqp reads what the broker sent before it publishes.
        assert [m.body for m in received] == [b"waiting"]
        channel.queue_delete(queue)


@pytest.mark.broker
@pytest.mark.parametrize("write", ["publish", "ack"])
def test_a_socket_error_while_writing_leaves_the_connection_as_py_amqp_does(
    amqp_url: str, write: str
) -> None:
    # Given a flowengine connection whose socket fails to send,
    conn = transports.connection(amqp_url, None)
    try:
        channel = conn.channel()
        connection = conn.connection  # (kombu's property would connect again)

        def broken_pipe(data: Any) -> None:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        connection.transport._write = broken_pipe
        # when it publishes or acknowledges, the socket's error is raised (a
        # connection error kombu recovers from) and the connection is lost.
        with pytest.raises(BrokenPipeError) as raised:
            if write == "publish":
                channel.basic_publish(channel.prepare_message(b"x"), exchange="", routing_key="q")
            else:
                channel.basic_ack(1)
        assert isinstance(raised.value, conn.connection_errors)
        assert not connection.connected
    finally:
        conn.release()


@pytest.mark.broker
def test_a_closed_channel_refuses_to_write_as_py_amqp_s_does(amqp_url: str) -> None:
    with transports.connection(amqp_url, None) as conn:
        channel = conn.channel()
        message = channel.prepare_message(b"x")
        channel.close()
        with pytest.raises(RecoverableConnectionError):
            channel.basic_publish(message, exchange="", routing_key="q")
        with pytest.raises(RecoverableConnectionError):
            channel.basic_ack(1)
        with pytest.raises(RecoverableConnectionError):
            channel.basic_reject(1, requeue=False)
