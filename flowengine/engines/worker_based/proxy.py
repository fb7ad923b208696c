"""Proxy: publishes messages to, and consumes messages from, a named exchange.

One consumer connection runs the loop (in the thread that calls start());
publishing goes through a second connection guarded by a lock, so any thread
(including a handler running inside the consume loop) can publish without
re-entering the consumer's connection (py-amqp would recurse into delivery).
The loop is supervised: a failing handler, an undecodable message or a broken
connection is logged and survived (reconnect, re-declare, re-consume) until
stop() is called.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import kombu
import kombu.exceptions
from kombu.utils import json as kombu_json

from flowengine import exceptions as exc
from flowengine.engines.worker_based import dispatcher as dispatcher_mod
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import transports

LOG = logging.getLogger(__name__)

#: Longest time (s) the consume loop blocks in drain_events before it checks
#: for stop() and runs on_wait. Messages never wait on it: drain_events
#: returns as soon as one arrives. Short so on_wait-driven work (request
#: expiry) stays timely and stop() is prompt even when no wake-up gets through.
ON_WAIT_PERIOD_S = 0.5

#: Pause (s) before reconnecting after the retry options gave up; the loop
#: then tries again (it only ends on stop()).
RECONNECT_BACKOFF_S = 2.0

#: Pause (s) after an unexpected (non-connection) error in the loop, so a
#: persistent fault cannot spin a CPU at 100 %.
UNEXPECTED_ERROR_BACKOFF_S = 0.1

#: Message type of the private wake-up message stop() sends to its own queue.
WAKE_TYPE = "FLOWENGINE_PROXY_WAKE"
_WAKE_HEADER = "flowengine_proxy_wake"

#: Transport option keys whose values are never shown (banner, logs).
_SECRET_OPTION_WORDS = ("password", "secret", "token", "key")


class QueueSpec(NamedTuple):
    """A queue the proxy consumes: its name, routing keys and lifetime."""

    name: str
    routing_keys: tuple[str, ...]
    auto_delete: bool = False


class TransportDetails(NamedTuple):
    """What a proxy's transport is (options with secrets masked)."""

    options: dict[str, Any]
    driver_type: str
    driver_name: str
    driver_version: str


class ConnectionDetails(NamedTuple):
    """Where a proxy connects (uri without password) and through what."""

    uri: str
    transport: TransportDetails


def mask_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Copy transport options with values of secret-looking keys replaced by '**'."""
    masked: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if any(word in str(key).lower() for word in _SECRET_OPTION_WORDS):
            masked[key] = "**"
        else:
            masked[key] = value
    return masked


class Proxy:
    """Handles messages to/from a named exchange (internal use, not public API).

    By default it consumes the queue ``<exchange>_<topic>`` bound with routing
    key ``topic`` (auto-deleted), plus the extra routing keys in ``bindings``
    (an executor adds ``ANNOUNCE_ROUTING_KEY``). ``queues`` replaces that with
    an explicit list (a worker consumes its topic queue and its private queue).
    ``wake_routing_key`` must reach only this proxy's queues; stop() sends a
    wake-up there so the loop ends at once (default: ``topic`` when ``queues``
    is not given, none otherwise).

    Callbacks (all run in the loop thread; their errors are logged, never
    fatal): ``on_start()`` each time consuming (re)starts, after the queues
    are declared; ``on_wait()`` at least every ``on_wait_period_s`` seconds;
    ``on_reject(message, reason)`` for each message refused (see
    TypeDispatcher).
    """

    #: Reconnection settings (kombu ``ensure``/``ensure_connection`` options).
    DEFAULT_RETRY_OPTIONS = {
        # The maximum number of times to retry (None: forever).
        "max_retries": 3,
        # Seconds before the first retry.
        "interval_start": 1,
        # Seconds added to the wait after each retry.
        "interval_step": 1,
        # Longest wait (seconds) between retries.
        "interval_max": 1,
    }

    def __init__(self, topic: str, exchange: str,
                 type_handlers: Mapping[str, dispatcher_mod.Handler] | None = None,
                 on_wait: Callable[[], None] | None = None, url: str | None = None,
                 transport: str | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 retry_options: Mapping[str, Any] | None = None, *,
                 bindings: Iterable[str] = (),
                 queues: Sequence[QueueSpec] | None = None,
                 wake_routing_key: str | None = None,
                 on_reject: Callable[[Any, str], None] | None = None,
                 on_start: Callable[[], None] | None = None,
                 on_wait_period_s: float = ON_WAIT_PERIOD_S,
                 max_body_bytes: int | None = pr.MAX_BODY_BYTES) -> None:
        self._topic = topic
        self._exchange_name = exchange
        self._on_wait = on_wait
        self._on_start = on_start
        self._on_wait_period_s = on_wait_period_s
        self._max_body_bytes = max_body_bytes
        self._retry_options = dict(self.DEFAULT_RETRY_OPTIONS)
        if retry_options:
            self._retry_options.update(retry_options)
        self._dispatcher = dispatcher_mod.TypeDispatcher(type_handlers=type_handlers,
                                                         on_reject=on_reject)
        if queues is None:
            keys = (topic, *[b for b in bindings if b != topic])
            queues = [QueueSpec(pr.topic_queue_name(exchange, topic), keys, auto_delete=True)]
            if wake_routing_key is None:
                wake_routing_key = topic
        self._queue_specs = list(queues)
        self._wake_routing_key = wake_routing_key
        self._wake_token = uuidlib.uuid4().hex
        self._transport_options = dict(transport_options or {})
        if url is None:
            # kombu warns without a hostname; name the transport instead.
            url = f"{transport}://" if transport and transport.isidentifier() else "localhost"
        # Built now (no network I/O) so a bad URL/transport fails here, loudly.
        self._conn = kombu.Connection(url, transport=transports.resolve(url, transport),
                                      transport_options=self._transport_options)
        if not self._conn.hostname:
            # memory:// and filesystem:// have no host; kombu would warn about
            # it on every clone (each reconnect).
            self._conn.hostname = "localhost"
        self._exchange = kombu.Exchange(exchange, type="direct", durable=False,
                                        auto_delete=False)
        self._running = threading.Event()
        self._stopping = threading.Event()
        self._loop_lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._pub_conn: kombu.Connection | None = None
        self._publish_fn: Callable[..., Any] | None = None
        self._uri = self._conn.as_uri(include_password=False)

    # --- read-only facts ---

    @property
    def topic(self) -> str:
        """The topic (default queue suffix and routing key)."""
        return self._topic

    @property
    def exchange(self) -> str:
        """Name of the exchange messages go through."""
        return self._exchange_name

    @property
    def queues(self) -> list[QueueSpec]:
        """The queues the consume loop reads."""
        return list(self._queue_specs)

    @property
    def dispatcher(self) -> dispatcher_mod.TypeDispatcher:
        """The dispatcher used internally to route each message by type."""
        return self._dispatcher

    @property
    def connection_details(self) -> ConnectionDetails:
        """Connection details (read-only, password and secret options masked)."""
        transport = self._conn.transport
        driver_version = transport.driver_version()
        return ConnectionDetails(
            uri=self._uri,
            transport=TransportDetails(
                options=mask_options(self._transport_options),
                driver_type=transport.driver_type,
                driver_name=transport.driver_name,
                driver_version=str(driver_version)))

    @property
    def is_running(self) -> bool:
        """True while the consume loop is consuming."""
        return self._running.is_set()

    # --- publishing ---

    def publish(self, msg: pr.Message, routing_key: str | Sequence[str],
                reply_to: str | None = None, correlation_id: str | None = None,
                headers: Mapping[str, Any] | None = None) -> None:
        """Publish ``msg`` to the exchange with ``routing_key`` (or each of several).

        Thread-safe. Raises SerializationFailure when the body cannot be
        encoded as JSON or is larger than ``max_body_bytes``, and kombu's
        OperationalError (or the transport's connection error) when the
        broker stays unreachable after the retry options are used up.
        """
        self._publish_raw(msg.TYPE, msg.to_dict(), routing_key, reply_to=reply_to,
                          correlation_id=correlation_id, headers=headers)

    def _publish_raw(self, msg_type: str, body: Any, routing_key: str | Sequence[str],
                     reply_to: str | None = None, correlation_id: str | None = None,
                     headers: Mapping[str, Any] | None = None) -> None:
        """Encode ``body`` once and publish it with the given ``type`` property."""
        try:
            payload = kombu_json.dumps(body)
        except (TypeError, ValueError, OverflowError) as e:
            raise exc.SerializationFailure(
                f"Cannot encode {msg_type} message body as JSON: {e}", cause=e)
        # The receiving side refuses bodies over the same limit unread: fail
        # here, where the caller can still turn it into a FAILURE reply.
        if self._max_body_bytes is not None and len(payload) > self._max_body_bytes:
            raise exc.SerializationFailure(
                f"{msg_type} message body of {len(payload)} bytes exceeds the limit of"
                f" {self._max_body_bytes} bytes")
        keys = [routing_key] if isinstance(routing_key, str) else list(routing_key)
        kwargs: dict[str, Any] = {"type": msg_type, "content_type": "application/json",
                                  "content_encoding": "utf-8"}
        if reply_to is not None:
            kwargs["reply_to"] = reply_to
        if correlation_id is not None:
            kwargs["correlation_id"] = correlation_id
        if headers:
            kwargs["headers"] = dict(headers)
        with self._publish_lock:
            publish = self._ensure_publisher()
            try:
                for key in keys:
                    publish(payload, exchange=self._exchange, routing_key=key, **kwargs)
            except Exception:
                # Start from a fresh connection next time instead of a broken one.
                self._reset_publisher()
                raise

    def _ensure_publisher(self) -> Callable[..., Any]:
        """Return the publish function, connecting and declaring once (lock held)."""
        if self._publish_fn is None:
            conn = self._conn.clone()
            try:
                conn.ensure_connection(errback=self._log_connect_error, **self._retry_options)
                producer = kombu.Producer(conn.channel(), exchange=self._exchange,
                                          auto_declare=True)
                # ensure() revives the producer (and re-declares the exchange)
                # after a reconnect; built once, not per publish.
                self._publish_fn = conn.ensure(producer, producer.publish,
                                               errback=self._log_connect_error,
                                               **self._retry_options)
            except Exception:
                conn.release()
                raise
            self._pub_conn = conn
        return self._publish_fn

    def _reset_publisher(self) -> None:
        """Drop the publishing connection (lock held)."""
        conn, self._pub_conn, self._publish_fn = self._pub_conn, None, None
        if conn is not None:
            try:
                conn.release()
            except Exception:  # already broken; nothing more to do
                LOG.debug("Error closing publisher connection", exc_info=True)

    def _log_connect_error(self, error: BaseException, interval: float) -> None:
        """kombu errback: say what failed and when the next attempt comes."""
        LOG.warning("Broker connection to %s failed (%s); retrying in %.1f s",
                    self._uri, error, interval)

    # --- consuming ---

    def start(self) -> None:
        """Run the consume loop in the calling thread until stop() is called."""
        if not self._loop_lock.acquire(blocking=False):
            raise RuntimeError(f"Proxy for topic {self._topic!r} is already running")
        self._stopping.clear()
        try:
            while not self._stopping.is_set():
                try:
                    self._consume_until_stopped()
                except Exception as e:
                    self._running.clear()
                    if self._stopping.is_set():
                        break
                    recoverable = isinstance(e, (OSError, kombu.exceptions.OperationalError)
                                             + tuple(self._conn.connection_errors)
                                             + tuple(self._conn.channel_errors))
                    if recoverable:
                        LOG.error("Consumer connection to %s lost (%s); reconnecting in"
                                  " %.1f s", self._uri, e, RECONNECT_BACKOFF_S)
                        self._stopping.wait(RECONNECT_BACKOFF_S)
                    else:
                        LOG.exception("Unexpected error in the consume loop of topic %r;"
                                      " restarting it", self._topic)
                        self._stopping.wait(UNEXPECTED_ERROR_BACKOFF_S)
        finally:
            self._running.clear()
            with self._publish_lock:
                self._reset_publisher()
            self._loop_lock.release()

    def _kombu_queues(self) -> list[kombu.Queue]:
        """kombu queues for the specs (each bound with all its routing keys)."""
        out = []
        for spec in self._queue_specs:
            bindings = [kombu.binding(self._exchange, routing_key=key)
                        for key in spec.routing_keys]
            out.append(kombu.Queue(spec.name, exchange=self._exchange, bindings=bindings,
                                   durable=False, auto_delete=spec.auto_delete))
        return out

    def _consume_until_stopped(self) -> None:
        """Connect, declare, consume and drain until stop() (raises on failures)."""
        conn = self._conn.clone()
        try:
            conn.ensure_connection(errback=self._log_connect_error, **self._retry_options)
            channel = conn.channel()
            self._exchange.declare(channel=channel)
            consumer = kombu.Consumer(channel, queues=self._kombu_queues(),
                                      on_message=self._on_message, accept=["json"],
                                      on_decode_error=self._dispatcher.on_decode_error)
            consumer.consume()
            self._running.set()
            LOG.debug("Consuming %s from %s", [q.name for q in self._queue_specs], self._uri)
            if self._on_start is not None:
                self._call_safely(self._on_start, "on_start")
            last_wait = time.monotonic()
            period = self._on_wait_period_s
            try:
                while not self._stopping.is_set():
                    try:
                        conn.drain_events(timeout=period)
                    except TimeoutError:
                        pass
                    now = time.monotonic()
                    if self._on_wait is not None and now - last_wait >= period:
                        last_wait = now
                        self._call_safely(self._on_wait, "on_wait")
            finally:
                self._running.clear()
                try:
                    consumer.cancel()
                except Exception:
                    LOG.debug("Error cancelling consumer", exc_info=True)
        finally:
            try:
                conn.release()
            except Exception:
                LOG.debug("Error closing consumer connection", exc_info=True)

    def _call_safely(self, callback: Callable[[], None], what: str) -> None:
        """Run a loop callback; its errors are logged, never fatal."""
        try:
            callback()
        except Exception:
            LOG.exception("%s callback of topic %r failed", what, self._topic)

    def _on_message(self, message: Any) -> None:
        """Receive one raw message: size check, decode, dispatch; never raises."""
        try:
            headers = message.headers or {}
            if (message.properties.get("type") == WAKE_TYPE
                    and headers.get(_WAKE_HEADER) == self._wake_token):
                message.ack()
                return
            if self._max_body_bytes is not None and len(message.body) > self._max_body_bytes:
                self._dispatcher.reject(message, f"body of {len(message.body)} bytes exceeds"
                                                 f" the limit of {self._max_body_bytes} bytes")
                return
            try:
                data = message.decode()
            except Exception as e:
                self._dispatcher.on_decode_error(message, e)
                return
            self._dispatcher.on_message(data, message)
        except Exception:
            LOG.exception("Unexpected error handling a message on topic %r", self._topic)
        finally:
            if not message.acknowledged:
                try:
                    message.ack()
                except Exception:
                    LOG.debug("Could not ack message", exc_info=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the proxy is consuming; False if ``timeout`` passed first."""
        return self._running.wait(timeout)

    def stop(self) -> None:
        """Ask the consume loop to end (it returns from start() promptly)."""
        self._stopping.set()
        if self._running.is_set() and self._wake_routing_key is not None:
            try:
                self._publish_raw(WAKE_TYPE, {}, self._wake_routing_key,
                                  headers={_WAKE_HEADER: self._wake_token})
            except Exception:
                # The loop still ends within ON_WAIT_PERIOD_S.
                LOG.debug("Could not send wake-up to topic %r", self._topic, exc_info=True)
