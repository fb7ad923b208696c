"""Receiving the event stream: every event of an exchange, handed to a callback.

Each receiver consumes from its own auto-deleted queue, bounded where the
broker supports it, and deletes it when done. A receiver whose connection
breaks once it consumes connects again (to another node of a failover URL
list when there is one) and consumes a new queue: the events published
meanwhile are missed, as a live view may miss them. A receiver given a secret
verifies every event's signature before decoding it and drops (and counts)
those that are unsigned, signed with an unknown key or altered.

An event that cannot be read (headers that are not a mapping, a compressed
or undecodable body: see ``messaging/guarded.py``) is acknowledged, counted
and logged, never raised: one bad publisher must not stop a viewer. Unlike
the consume loops of workers and engines, a receiver does not dead-letter
it: the stream is a live view, not a record, and a copy published back to
the events exchange would reach every receiver again.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kombu.connection import Connection
from kombu.entity import Queue
from kombu.message import Message
from kombu.messaging import Consumer

from flowengine import exceptions as exc
from flowengine.engines.worker_based.events import channel
from flowengine.engines.worker_based.events import signing as event_signing
from flowengine.engines.worker_based.events.model import LamportClock
from flowengine.engines.worker_based.messaging import guarded
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import failover
from flowengine.engines.worker_based.wire import signing

LOG = logging.getLogger(__name__)

#: Messages a receiver's queue keeps on brokers that honour a length limit
#: (RabbitMQ): a stalled viewer must not fill the broker.
RECEIVER_QUEUE_MAX_LENGTH = 10_000

#: Milliseconds an event may wait in a receiver's queue (RabbitMQ): older
#: events describe a past no live view needs.
RECEIVER_MESSAGE_TTL_MS = 60_000

#: Seconds a receiver's loop waits for a message before checking for stop().
RECEIVE_POLL_S = 0.2

#: Seconds a receiver waits before consuming again after its connection broke
#: (and between attempts while no broker node answers).
RECONNECT_PAUSE_S = 1.0

#: Seconds between warnings about dropped unverified events: the first one
#: is logged at once, then at most one per period (with the running count),
#: so a flood of forged events cannot flood the log too.
UNVERIFIED_WARNING_PERIOD_S = 10.0


class EventReceiver:
    """Consumes every event of an exchange's event stream and hands each to ``handler``.

    Each receiver has its own auto-deleted queue, bounded where the broker
    supports it; events published before :meth:`wait_ready` returned True
    may be missed (the stream is live, not a log).

    With ``secret`` (a :class:`~.signing.Keyring`, a key or a list of keys)
    only events signed with one of its keys reach ``handler``; the others
    are dropped unread, counted in :attr:`unverified_count` and logged at
    WARNING with the reason. Without it (None, the default, or False) every
    event is accepted, signed or not; the environment is not read here.
    ``broker`` (a BrokerSettings) may stand for ``url``, ``transport`` and
    ``transport_options``. Raises ValueError for a key that is too short.
    """

    def __init__(
        self,
        exchange: str,
        handler: Callable[[dict[str, Any]], Any],
        url: str | None = None,
        transport: str | None = None,
        transport_options: Mapping[str, Any] | None = None,
        secret: Any = None,
        *,
        broker: BrokerSettings | None = None,
    ) -> None:
        self.keyring = None if secret is None else signing.load_keyring(secret)
        #: Events dropped because their signature was missing or wrong.
        self.unverified_count = 0
        #: Messages dropped because they could not be read at all.
        self.unreadable_count = 0
        self._last_warning = float("-inf")
        self._exchange_name = exchange
        self._handler = handler
        # Signing is this object's own (``secret``), not the broker settings'.
        self._broker = BrokerSettings.given(broker, url, transport, transport_options, secret=False)
        self.clock = LamportClock()
        self._ready = threading.Event()
        # Set once run() is consuming *or* has failed: wait_ready() must not
        # wait its whole timeout for a broker that already said no.
        self._started_or_failed = threading.Event()
        self._stop = threading.Event()
        self._queue_name = f"{channel.events_exchange_name(exchange)}.{uuidlib.uuid4().hex}"

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the queue is bound and consumed; False if run() failed or time ran out."""
        self._started_or_failed.wait(timeout)
        return self._ready.is_set()

    def stop(self) -> None:
        """Make run() return after the message being handled (thread-safe)."""
        self._stop.set()

    def run(self, limit: int | None = None) -> int:
        """Consume until stop() (or ``limit`` events); return how many were handled."""
        exchange = channel.exchange(self._exchange_name)
        bounded = Queue(
            self._queue_name,
            exchange=exchange,
            routing_key="#",
            durable=False,
            auto_delete=True,
            queue_arguments={
                "x-max-length": RECEIVER_QUEUE_MAX_LENGTH,
                "x-message-ttl": RECEIVER_MESSAGE_TTL_MS,
            },
        )
        handled = itertools.count()
        count = 0
        conn: Connection | None = None
        keyring = self.keyring  # read once: checking it costs nothing per event when None

        def on_message(message: Message) -> None:
            nonlocal count
            message.ack()
            if keyring is not None:
                try:
                    event_signing.verify(keyring, message.body, message.headers)
                except exc.UnverifiedMessage as e:
                    self._refuse(str(e))
                    return
            try:
                body = message.decode()
            except Exception as e:  # not JSON, or a content type we refuse
                LOG.warning("Ignored an event that cannot be decoded: %s", e)
                return
            for event in decode(body):
                if "clock" in event:
                    self.clock.adjust(event["clock"])
                try:
                    self._handler(event)
                except Exception:
                    LOG.exception("Event handler failed on %s", event.get("type"))
                count = next(handled) + 1
                if limit is not None and count >= limit:
                    self._stop.set()

        def on_unreadable(message: Message, error: BaseException) -> None:
            try:
                message.ack()
            except Exception:
                LOG.debug("Could not acknowledge an unreadable event", exc_info=True)
            self.unreadable_count += 1
            self._warn_dropped(f"unreadable ({error})", self.unreadable_count)

        while True:
            try:
                # One attempt (each node of a failover list once), raised as
                # it is: kombu would retry a refused login or an unreachable
                # broker for its connect timeout first.
                conn = failover.connect_any(channel.connection(self._broker))
                events_channel = conn.channel()
                guarded.guard(events_channel)
                with Consumer(
                    events_channel,
                    [bounded],
                    on_message=on_message,
                    on_decode_error=on_unreadable,
                    accept=["json"],
                ):
                    self._ready.set()
                    self._started_or_failed.set()
                    while not self._stop.is_set():
                        try:
                            conn.drain_events(timeout=RECEIVE_POLL_S)
                        except TimeoutError:  # socket.timeout too: an alias since 3.10
                            continue
                forget_queue(conn, bounded)
                return count
            except Exception as e:
                # Lost after it was consuming (its node died): consume again,
                # on another node of a failover list if there is one. Before
                # that, the caller hears why it never started.
                if not self._ready.is_set() or self._stop.is_set():
                    raise
                LOG.warning(
                    "Event stream of %s lost (%s); reconnecting in %.1f s",
                    channel.events_exchange_name(self._exchange_name),
                    e,
                    RECONNECT_PAUSE_S,
                )
                self._stop.wait(RECONNECT_PAUSE_S)
            finally:
                self._started_or_failed.set()
                if conn is not None:
                    channel.release(conn)
                    conn = None

    def _refuse(self, reason: str) -> None:
        """Count an event that failed verification; warn now and then, saying why."""
        self.unverified_count += 1
        self._warn_dropped(
            f"{reason}; the monitor shows only events signed with a key it holds",
            self.unverified_count,
        )

    def _warn_dropped(self, reason: str, count: int) -> None:
        """Warn of a dropped event, at most once per UNVERIFIED_WARNING_PERIOD_S."""
        now = time.monotonic()
        if now - self._last_warning >= UNVERIFIED_WARNING_PERIOD_S:
            self._last_warning = now
            LOG.warning(
                "Dropped an event from %s unread: %s (%d dropped so far)",
                channel.events_exchange_name(self._exchange_name),
                reason,
                count,
            )


def decode(body: Any) -> Iterator[dict[str, Any]]:
    """Events in a message body: one mapping or a list of them (JSON text or decoded).

    Anything that is not an event (not JSON, no string ``type``) is logged
    and skipped, never raised: one bad sender must not stop a viewer.
    """
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


def forget_queue(conn: Connection, bound: Queue) -> None:
    """Delete a receiver's queue, so publishers stop filling it.

    Deleting also removes the queue's binding (on the filesystem transport
    from the exchange's table file; tests check that no file piles up).
    """
    try:
        bound(conn.default_channel).delete()
    except Exception:
        LOG.debug("Could not delete events queue %s", bound.name, exc_info=True)
