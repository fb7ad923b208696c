"""Publishing events without ever blocking the caller on the broker.

:meth:`EventPublisher.send` stamps the event and puts it on a bounded
buffer that one thread publishes; when the buffer is full the event is
dropped and counted. With a keyring (``secret``) every event is signed, so
receivers holding the key can tell it from a forged one (see
:mod:`.event_signing`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from kombu.connection import Connection
from kombu.messaging import Producer

from flowengine.engines.worker_based.events import channel
from flowengine.engines.worker_based.events import signing as event_signing
from flowengine.engines.worker_based.events.model import (
    LamportClock,
    default_hostname,
    make_event,
)
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import failover
from flowengine.engines.worker_based.wire import signing

LOG = logging.getLogger(__name__)

#: Events a publisher holds while its thread is behind; past this they are
#: dropped (a slow or absent broker must not grow a worker's memory).
EVENT_BUFFER_SIZE = 10_000

#: Seconds a publisher waits for its buffer to drain on close().
CLOSE_FLUSH_S = 2.0

#: Seconds a publisher waits before reconnecting after a broker error.
RECONNECT_DELAY_S = 1.0


class EventPublisher:
    """Publishes events for one sender (a worker or an engine) from one thread.

    ``enabled=False`` makes every method a cheap no-op, so callers need no
    checks of their own. ``secret`` (a :class:`~.signing.Keyring`, a key or
    a list of keys; the first signs) signs every event; None or False: events
    go unsigned (the environment is not read here: the sender decides).
    ``broker`` (a BrokerSettings) may stand for ``url``, ``transport`` and
    ``transport_options``. Raises ValueError for a key that is too short.
    """

    def __init__(
        self,
        exchange: str,
        url: str | None = None,
        transport: str | None = None,
        transport_options: Mapping[str, Any] | None = None,
        hostname: str | None = None,
        enabled: bool = True,
        buffer_size: int = EVENT_BUFFER_SIZE,
        secret: Any = None,
        *,
        broker: BrokerSettings | None = None,
    ) -> None:
        self.enabled = enabled
        self.keyring = None if secret is None else signing.load_keyring(secret)
        self.hostname = hostname or default_hostname()
        self.pid = os.getpid()
        self.clock = LamportClock()
        self.dropped = 0
        self._exchange_name = exchange
        # Signing is this object's own (``secret``), not the broker settings'.
        self._broker = BrokerSettings.given(broker, url, transport, transport_options, secret=False)
        # Events, flush() markers, and None: the thread's signal to end.
        self._buffer: queue.Queue[dict[str, Any] | threading.Event | None] = queue.Queue(
            buffer_size
        )
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def send(self, event_type: str, /, **fields: Any) -> dict[str, Any] | None:
        """Stamp and queue one event; returns it (None when disabled, closed or dropped)."""
        if not self.enabled or self._closed:
            return None
        event = make_event(event_type, self.hostname, self.pid, fields)
        # Clock and buffer order are taken together: events leave in clock order.
        with self._send_lock:
            event["clock"] = self.clock.forward()
            try:
                self._buffer.put_nowait(event)
            except queue.Full:
                self.dropped += 1
                return None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._publish_loop,
                    daemon=True,
                    name=f"flowengine-events-{self.hostname}",
                )
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
                LOG.warning(
                    "Events of %s not all published: buffer still full after %.1f s",
                    self.hostname,
                    timeout,
                )
                return
        thread.join(timeout)

    def _publish_loop(self) -> None:
        """Take events from the buffer and publish them until close()."""
        conn: Connection | None = None
        producer: Producer | None = None
        exchange = channel.exchange(self._exchange_name)
        keyring = self.keyring
        while True:
            event = self._buffer.get()
            if event is None:
                break
            if isinstance(event, threading.Event):  # a flush() marker
                event.set()
                continue
            try:
                body = json.dumps(event).encode("utf-8")
                # Signed here, on the publishing thread: send() stays as cheap
                # with a key as without one.
                headers = None if keyring is None else event_signing.sign(keyring, body)
            except Exception as e:
                self.dropped += 1
                LOG.warning(
                    "Event %s of %s dropped: it cannot be encoded (%s)",
                    event.get("type"),
                    self.hostname,
                    e,
                )
                continue
            # A connection that broke since the last event (its broker node
            # died) gets one fresh one at once (another node of a failover
            # list): only a broker that refuses a new connection drops events.
            fresh = producer is None
            while True:
                try:
                    if producer is None:
                        conn = failover.connect_any(channel.connection(self._broker))
                        producer = Producer(conn.channel(), exchange=exchange, auto_declare=True)
                    producer.publish(
                        body,
                        routing_key=event["type"],
                        headers=headers,
                        content_type="application/json",
                        content_encoding="utf-8",
                        delivery_mode=1,
                    )
                    break
                except Exception as e:
                    producer = None
                    if conn is not None:
                        channel.release(conn)
                        conn = None
                    if not fresh:
                        fresh = True
                        LOG.info(
                            "Events connection of %s lost (%s); reconnecting", self.hostname, e
                        )
                        continue
                    self.dropped += 1
                    LOG.warning(
                        "Event %s of %s dropped: the events exchange is unreachable"
                        " (%s); retrying in %.1f s",
                        event["type"],
                        self.hostname,
                        e,
                        RECONNECT_DELAY_S,
                    )
                    time.sleep(RECONNECT_DELAY_S)  # back off from a broker that is down
                    break
        if conn is not None:
            channel.release(conn)
