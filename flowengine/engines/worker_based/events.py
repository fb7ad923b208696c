"""Event stream: JSON events about workers, requests and flows on a fanout exchange.

Workers and engines publish what happens (``worker-online``,
``task-started``, ``flow-finished``, ...) on the exchange
``<exchange>.events``: fanout, non-durable, transient messages, so nothing is
kept when nobody listens. Every event is one JSON object with the standard
fields ``type``, ``hostname``, ``pid``, ``clock`` (the sender's Lamport
clock), ``timestamp`` (epoch seconds) and ``utcoffset`` (hours), plus the
fields of its type (request ``uuid``, ``name``, ``root_id``, ``attempt``,
``runtime``, ``created``/``enqueued``/``started``/``ended``, ...).

Publishing never blocks the caller on the broker: :meth:`EventPublisher.send`
stamps the event and puts it on a bounded buffer that one thread publishes;
when the buffer is full the event is dropped and counted. Receivers consume
from their own bounded, auto-deleted queue.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kombu

from flowengine.engines.worker_based import transports

LOG = logging.getLogger(__name__)

#: Suffix of the events exchange name (``<exchange>.events``): the task
#: exchange is direct, so events need an exchange of their own to fan out.
EVENTS_EXCHANGE_SUFFIX = ".events"

#: Events a publisher holds while its thread is behind; past this they are
#: dropped (a slow or absent broker must not grow a worker's memory).
EVENT_BUFFER_SIZE = 10_000

#: Messages a receiver's queue keeps on brokers that honour a length limit
#: (RabbitMQ): a stalled viewer must not fill the broker.
RECEIVER_QUEUE_MAX_LENGTH = 10_000

#: Milliseconds an event may wait in a receiver's queue (RabbitMQ): older
#: events describe a past no live view needs.
RECEIVER_MESSAGE_TTL_MS = 60_000

#: Seconds between worker-heartbeat events: often enough for a live view to
#: tell a silent worker from a dead one within a few seconds.
HEARTBEAT_PERIOD_S = 2.0

#: Seconds a publisher waits for its buffer to drain on close().
CLOSE_FLUSH_S = 2.0

#: Seconds a receiver's loop waits for a message before checking for stop().
RECEIVE_POLL_S = 0.2

#: Seconds a publisher waits before reconnecting after a broker error.
RECONNECT_DELAY_S = 1.0

#: Event types, by sender.
WORKER_EVENTS = ("worker-online", "worker-heartbeat", "worker-offline")
TASK_EVENTS = ("task-received", "task-started", "task-progress", "task-succeeded",
               "task-failed", "task-retried", "task-expired")
FLOW_EVENTS = ("flow-started", "flow-finished")
EVENT_TYPES = WORKER_EVENTS + TASK_EVENTS + FLOW_EVENTS

#: Task event types after which a request sends nothing more.
TERMINAL_TASK_EVENTS = ("task-succeeded", "task-failed", "task-expired")

#: Request headers carrying RQ-style timings (epoch seconds) to the worker.
HEADER_CREATED = "created"
HEADER_ENQUEUED = "enqueued"

#: Standard fields every event has.
STANDARD_FIELDS = ("type", "hostname", "pid", "clock", "timestamp", "utcoffset")


def events_exchange_name(exchange: str) -> str:
    """The events exchange that goes with task exchange ``exchange``."""
    return exchange + EVENTS_EXCHANGE_SUFFIX


def utcoffset_hours() -> int:
    """This host's offset from UTC in whole hours (east positive)."""
    offset = time.localtime().tm_gmtoff
    return int(round(offset / 3600))


def default_hostname() -> str:
    """``name@host`` for this process: pid-qualified so two workers on a host differ."""
    return f"{os.getpid()}@{socket.gethostname()}"


class LamportClock:
    """A Lamport clock: strictly increasing per sender, moved past every value seen."""

    def __init__(self, initial: int = 0) -> None:
        self._value = initial
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        """The last value handed out (or seen)."""
        return self._value

    def forward(self) -> int:
        """Advance for a local event and return the new value."""
        with self._lock:
            self._value += 1
            return self._value

    def adjust(self, other: int) -> int:
        """Move past a received value ``other``; return the new value."""
        with self._lock:
            self._value = max(self._value, int(other)) + 1
            return self._value


def _connection(url: str | None, transport: str | None,
                transport_options: Mapping[str, Any] | None) -> kombu.Connection:
    """A kombu connection built like the proxy builds its own."""
    if url is None:
        url = f"{transport}://" if transport and transport.isidentifier() else "localhost"
    conn = kombu.Connection(url, transport=transports.resolve(url, transport),
                            transport_options=dict(transport_options or {}))
    if not conn.hostname:
        conn.hostname = "localhost"
    return conn


def _exchange(exchange: str) -> kombu.Exchange:
    """The fanout, non-durable events exchange for task exchange ``exchange``."""
    return kombu.Exchange(events_exchange_name(exchange), type="fanout", durable=False,
                          auto_delete=False, delivery_mode="transient")


class EventPublisher:
    """Publishes events for one sender (a worker or an engine) from one thread.

    ``enabled=False`` makes every method a cheap no-op, so callers need no
    checks of their own.
    """

    def __init__(self, exchange: str, url: str | None = None, transport: str | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 hostname: str | None = None, enabled: bool = True,
                 buffer_size: int = EVENT_BUFFER_SIZE) -> None:
        self.enabled = enabled
        self.hostname = hostname or default_hostname()
        self.pid = os.getpid()
        self.clock = LamportClock()
        self.dropped = 0
        self._exchange_name = exchange
        self._url, self._transport = url, transport
        self._transport_options = dict(transport_options or {})
        self._buffer: queue.Queue[Any] = queue.Queue(buffer_size)
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def send(self, event_type: str, /, **fields: Any) -> dict[str, Any] | None:
        """Stamp and queue one event; returns it (None when disabled, closed or dropped)."""
        if not self.enabled or self._closed:
            return None
        event = {"type": event_type, "hostname": self.hostname, "pid": self.pid,
                 "clock": 0, "timestamp": time.time(), "utcoffset": utcoffset_hours()}
        event.update(fields)
        # Clock and buffer order are taken together: events leave in clock order.
        with self._send_lock:
            event["clock"] = self.clock.forward()
            try:
                self._buffer.put_nowait(event)
            except queue.Full:
                self.dropped += 1
                return None
            if self._thread is None:
                self._thread = threading.Thread(target=self._publish_loop, daemon=True,
                                                name=f"flowengine-events-{self.hostname}")
                self._thread.start()
        return event

    def flush(self, timeout: float = CLOSE_FLUSH_S) -> bool:
        """Wait until every event sent so far was published; False on timeout."""
        with self._send_lock:
            if self._thread is None or self._closed:
                return True
            marker = threading.Event()
            try:
                self._buffer.put(marker, timeout=timeout)
            except queue.Full:
                return False
        return marker.wait(timeout)

    def idle(self, timeout: float = CLOSE_FLUSH_S) -> bool:
        """Publish what is buffered and end the thread and its connection for now.

        The next send() starts them again (an engine between runs holds no
        connection). False when the thread did not finish within ``timeout``.
        """
        with self._send_lock:
            thread = self._thread
            if thread is None or self._closed:
                return True
            try:
                self._buffer.put(None, timeout=timeout)
            except queue.Full:
                return False
            # Joined under the lock: a new thread must not overtake the old one.
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
            return True

    def close(self, timeout: float = CLOSE_FLUSH_S) -> None:
        """Publish what is buffered (waiting up to ``timeout`` s) and stop the thread."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is None:
                return
            try:
                self._buffer.put(None, timeout=timeout)
            except queue.Full:
                LOG.warning("Events of %s not all published: buffer still full after"
                            " %.1f s", self.hostname, timeout)
                return
        thread.join(timeout)

    def _publish_loop(self) -> None:
        """Take events from the buffer and publish them until close()."""
        conn = producer = None
        exchange = _exchange(self._exchange_name)
        while True:
            event = self._buffer.get()
            if event is None:
                break
            if isinstance(event, threading.Event):  # a flush() marker
                event.set()
                continue
            try:
                if producer is None:
                    conn = _connection(self._url, self._transport, self._transport_options)
                    producer = kombu.Producer(conn.channel(), exchange=exchange,
                                              auto_declare=True)
                producer.publish(json.dumps(event), routing_key=event["type"],
                                 content_type="application/json",
                                 content_encoding="utf-8", delivery_mode=1)
            except Exception as e:
                self.dropped += 1
                LOG.warning("Event %s of %s dropped: the events exchange is unreachable"
                            " (%s); retrying in %.1f s", event["type"], self.hostname, e,
                            RECONNECT_DELAY_S)
                producer = None
                if conn is not None:
                    _release(conn)
                    conn = None
                time.sleep(RECONNECT_DELAY_S)  # back off from a broker that is down
        if conn is not None:
            _release(conn)


def _release(conn: kombu.Connection) -> None:
    try:
        conn.release()
    except Exception:  # already broken; nothing more to do
        LOG.debug("Error closing events connection", exc_info=True)


class EventReceiver:
    """Consumes every event of an exchange's event stream and hands each to ``handler``.

    Each receiver has its own auto-deleted queue, bounded where the broker
    supports it; events published before :meth:`wait_ready` returned True
    may be missed (the stream is live, not a log).
    """

    def __init__(self, exchange: str, handler: Callable[[dict[str, Any]], Any],
                 url: str | None = None, transport: str | None = None,
                 transport_options: Mapping[str, Any] | None = None) -> None:
        self._exchange_name = exchange
        self._handler = handler
        self._url, self._transport = url, transport
        self._transport_options = dict(transport_options or {})
        self.clock = LamportClock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._queue_name = f"{events_exchange_name(exchange)}.{uuidlib.uuid4().hex}"

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the queue is bound and consumed; False if ``timeout`` passed first."""
        return self._ready.wait(timeout)

    def stop(self) -> None:
        """Make run() return after the message being handled (thread-safe)."""
        self._stop.set()

    def run(self, limit: int | None = None) -> int:
        """Consume until stop() (or ``limit`` events); return how many were handled."""
        exchange = _exchange(self._exchange_name)
        bounded = kombu.Queue(self._queue_name, exchange=exchange, routing_key="#",
                              durable=False, auto_delete=True,
                              queue_arguments={"x-max-length": RECEIVER_QUEUE_MAX_LENGTH,
                                               "x-message-ttl": RECEIVER_MESSAGE_TTL_MS})
        handled = itertools.count()
        count = 0
        conn = _connection(self._url, self._transport, self._transport_options)

        def on_message(body: Any, message: Any) -> None:
            nonlocal count
            message.ack()
            for event in _decode(body):
                if "clock" in event:
                    self.clock.adjust(event["clock"])
                try:
                    self._handler(event)
                except Exception:
                    LOG.exception("Event handler failed on %s", event.get("type"))
                count = next(handled) + 1
                if limit is not None and count >= limit:
                    self._stop.set()

        try:
            with conn.Consumer([bounded], callbacks=[on_message], accept=["json"]):
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=RECEIVE_POLL_S)
                    except TimeoutError:  # socket.timeout too: an alias since 3.10
                        continue
            _forget_queue(conn, bounded)
        finally:
            _release(conn)
        return count


def _decode(body: Any) -> Iterator[dict[str, Any]]:
    """Events in a message body: one mapping or a list of them (JSON text or decoded)."""
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            LOG.warning("Ignored an event that is not JSON: %.100r", body)
            return
    items = body if isinstance(body, list) else [body]
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("type"), str):
            yield item
        else:
            LOG.warning("Ignored a malformed event: %.100r", item)


def _forget_queue(conn: kombu.Connection, bound: kombu.Queue) -> None:
    """Delete a receiver's queue, so publishers stop filling it.

    Deleting also removes the queue's binding (on the filesystem transport
    from the exchange's table file; tests check that no file piles up).
    """
    try:
        bound(conn.default_channel).delete()
    except Exception:
        LOG.debug("Could not delete events queue %s", bound.name, exc_info=True)


def request_timings(headers: Mapping[str, Any], started: float | None = None,
                    ended: float | None = None) -> dict[str, Any]:
    """RQ-style timings of a request (epoch seconds; absent ones omitted)."""
    timings = {"created": headers.get(HEADER_CREATED),
               "enqueued": headers.get(HEADER_ENQUEUED),
               "started": started, "ended": ended}
    return {k: v for k, v in timings.items() if v is not None}


def timing_headers(created_at: float) -> dict[str, float]:
    """Headers an executor adds to each dispatch: creation and enqueue times."""
    return {HEADER_CREATED: created_at, HEADER_ENQUEUED: time.time()}
