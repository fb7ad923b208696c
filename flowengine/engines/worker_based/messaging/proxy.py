"""Proxy: publishes messages to, and consumes messages from, a named exchange.

One consumer connection runs the loop (in the thread that calls start());
publishing goes through a second connection guarded by a lock, so any thread
(including a handler running inside the consume loop) can publish without
re-entering the consumer's connection (py-amqp would recurse into delivery).
The loop is supervised: a failing handler, an undecodable message or a broken
connection is logged and survived (reconnect, re-declare, re-consume) until
stop() is called. Publishing is bounded: a broker that stays unreachable for
``publish_timeout_s`` makes publish() raise PublishTimeout (recoverable).
With a signing key every message sent is signed and every message received
is verified before it is decoded (see signing.py); ``durable=True`` selects
the durable topology (see topology.py).

On a leasing transport (flowengine's Redis transport) each queue is consumed
on a channel of its own, a LeaseKeeper keeps this consumer's lease alive
(leases.py), and publish(..., settles=message) sends a reply and settles the
message it answers in one atomic step.
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
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging import compat as compat_mod
from flowengine.engines.worker_based.messaging import dispatcher as dispatcher_mod
from flowengine.engines.worker_based.transports import errors as broker_errors
from flowengine.engines.worker_based.transports import leases, recovery, redis_consumers, topology
from flowengine.engines.worker_based.wire import signing

LOG = logging.getLogger(__name__)

#: Longest time (s) the consume loop blocks in drain_events before it checks
#: for stop() and runs on_wait. Messages never wait on it: drain_events
#: returns as soon as one arrives. Short so on_wait-driven work (request
#: expiry) stays timely and stop() is prompt even when no wake-up gets through.
ON_WAIT_PERIOD_S = 0.5

#: Pause (s) before reconnecting after the retry options gave up; the loop
#: then tries again (it only ends on stop()). Each further failure in a row
#: doubles the pause up to RECONNECT_BACKOFF_MAX_S, so a broker that stays
#: away costs one log line per step, not one per second; the cap keeps the
#: recovery after a long outage within seconds of the broker's return.
RECONNECT_BACKOFF_S = 2.0
RECONNECT_BACKOFF_MAX_S = 16.0

#: Pause (s) after an unexpected (non-connection) error in the loop, so a
#: persistent fault cannot spin a CPU at 100 %.
UNEXPECTED_ERROR_BACKOFF_S = 0.1

#: Longest time (s) publish() keeps trying while the broker is unreachable
#: before it raises PublishTimeout: covers a broker restart (RabbitMQ needs
#: ~5-10 s to boot) while the caller still learns about a real outage within
#: the executor's default transition timeout (60 s).
PUBLISH_TIMEOUT_S = 30.0

#: Longest pause (s) between two publish attempts during an outage; the
#: pauses start at PUBLISH_BACKOFF_START_S and double up to this.
PUBLISH_BACKOFF_MAX_S = 1.0
PUBLISH_BACKOFF_START_S = 0.1

#: Bound (s) on one connection attempt of the publisher (within the publish
#: timeout): a broker host that drops packets must not eat the whole budget.
PUBLISH_CONNECT_TIMEOUT_S = 5.0

#: AMQP heartbeat (s) negotiated with the broker: a silently dead peer (half
#: open TCP, network partition) is noticed within two periods instead of the
#: OS keepalive's hours; generous enough that a loaded 2-core machine never
#: misses one. Transports without heartbeats ignore it.
AMQP_HEARTBEAT_S = 20.0

#: Bound (s) on the wake-up stop() publishes: stop() must not wait out a
#: broker outage (the loop ends within ON_WAIT_PERIOD_S anyway).
WAKE_PUBLISH_TIMEOUT_S = 1.0

#: Message type of the private wake-up message stop() sends to its own queue.
WAKE_TYPE = "FLOWENGINE_PROXY_WAKE"
_WAKE_HEADER = "flowengine_proxy_wake"

#: Transport option keys whose values are never shown (banner, logs).
_SECRET_OPTION_WORDS = ("password", "secret", "token", "key")


class QueueSpec(NamedTuple):
    """A queue the proxy consumes: its name, routing keys and lifetime.

    ``private``: only this proxy's process consumes it, so it may be deleted
    when the process is gone (leasing transports do; AMQP's auto_delete does).
    """

    name: str
    routing_keys: tuple[str, ...]
    auto_delete: bool = False
    private: bool = False


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
                 max_body_bytes: int | None = pr.MAX_BODY_BYTES,
                 durable: bool = False, secret: Any = None,
                 publish_timeout_s: float = PUBLISH_TIMEOUT_S,
                 heartbeat_s: float = AMQP_HEARTBEAT_S,
                 prefetch_count: int | None = None,
                 compat: str | None = None, consumer_id: str | None = None,
                 lease_s: float | None = None, reclaim: bool = False,
                 quiet_until_started: bool = False) -> None:
        self._topic = topic
        # Unacknowledged messages the broker may push per queue (None: no limit).
        self._prefetch_count = prefetch_count
        self._exchange_name = exchange
        self._on_wait = on_wait
        self._on_start = on_start
        self._on_wait_period_s = on_wait_period_s
        self._max_body_bytes = max_body_bytes
        self._durable = bool(durable)
        # Read once: a key file is not re-read per message.
        self._keyring = signing.load_keyring(secret)
        self._publish_timeout_s = publish_timeout_s
        #: Consumer reconnections so far, and how long the last outage lasted
        #: (s, from the error to consuming again); for logs, tests and stats.
        self.reconnect_count = 0
        self.last_outage_s: float | None = None
        self._lost_at: float | None = None
        # Which Redis server process we last consumed from (None off Redis).
        self._broker_run_id: str | None = None
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
        # Built now (no network I/O) so a bad URL/transport fails here, loudly.
        self._conn = transports.connection(url, transport, self._transport_options,
                                           heartbeat=heartbeat_s)
        self._lease: leases.LeaseKeeper | None = None
        if getattr(self._conn.transport, "supports_leases", False):
            consumer_id = consumer_id or uuidlib.uuid4().hex
            lease_s = redis_consumers.DEFAULT_LEASE_S if lease_s is None else lease_s
            self._conn.transport_options[redis_consumers.CONSUMER_OPTION] = consumer_id
            self._conn.transport_options[redis_consumers.LEASE_OPTION] = lease_s
            self._lease = leases.LeaseKeeper(self._conn, consumer_id, lease_s, reclaim)
        if self._durable and self._conn.transport.driver_type == "amqp":
            # Durable means "survives a broker restart": publish() returns only
            # once RabbitMQ has taken the message (publisher confirms).
            self._conn.transport_options.setdefault("confirm_publish", True)
        # compat='taskflow': declared as TaskFlow does (see compat.py).
        self._exchange = compat_mod.make_exchange(exchange, durable=self._durable,
                                                  compat=compat,
                                                  signed=self._keyring is not None)
        self._running = threading.Event()
        self._stopping = threading.Event()
        # The last broker problem since consuming last (re)started, classified;
        # the condition wakes wait_started() on it and on consuming.
        self._problem: exc.BrokerConfigError | exc.BrokerUnavailable | None = None
        self._consumed_since_failure = False
        self._has_consumed = False
        # An engine's proxy: its owner raises what prevents the first start
        # (wait_started), so logging it too would say it twice.
        self._quiet_until_started = quiet_until_started
        self._started_or_failed = threading.Condition()
        self._loop_lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._pub_conn: kombu.Connection | None = None
        self._producer: kombu.Producer | None = None
        self._uri = transports.public_uri(self._conn.as_uri(include_password=False))

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
    def durable(self) -> bool:
        """True when the exchange and queues are durable and messages persistent."""
        return self._durable

    @property
    def keyring(self) -> signing.Keyring | None:
        """The keys messages are signed and verified with (None: signing off)."""
        return self._keyring

    @property
    def unverified_count(self) -> int:
        """Messages refused because they were unsigned or badly signed."""
        return self._dispatcher.unverified_count

    @property
    def has_consumed(self) -> bool:
        """True once the consume loop has declared its queues and consumed (ever)."""
        return self._has_consumed

    @property
    def is_running(self) -> bool:
        """True while the consume loop is consuming."""
        return self._running.is_set()

    # --- publishing ---

    def publish(self, msg: pr.Message, routing_key: str | Sequence[str],
                reply_to: str | None = None, correlation_id: str | None = None,
                headers: Mapping[str, Any] | None = None,
                timeout_s: float | None = None, settles: Any = None) -> None:
        """Publish ``msg`` to the exchange with ``routing_key`` (or each of several).

        Thread-safe. While the broker is unreachable it keeps trying (new
        connection, exchange declared again) for ``timeout_s`` (default: the
        proxy's ``publish_timeout_s``). Raises SerializationFailure when the
        body cannot be encoded as JSON or is larger than ``max_body_bytes``,
        PublishTimeout (a recoverable BrokerUnavailable) when the broker stayed
        unreachable, and the transport's channel errors (e.g. a declaration
        conflicting with the broker's) as they are.

        ``settles``: a message received by this proxy's consume loop that this
        publication answers (call from the consume loop's thread). It is
        acknowledged with the publication: atomically on a leasing transport,
        right after it elsewhere. DeliveryNotSettled when it could not be:
        the caller must then not act on it (the broker gives it again, or
        already gave it to another consumer).
        """
        self._publish_raw(msg.TYPE, msg.to_dict(), routing_key, reply_to=reply_to,
                          correlation_id=correlation_id, headers=headers,
                          timeout_s=timeout_s, settles=settles)

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a received ``message`` (consume-loop thread); DeliveryNotSettled if not."""
        try:
            message.ack()
        except exc.DeliveryNotSettled:
            raise
        except Exception as e:
            raise exc.DeliveryNotSettled(
                f"Could not acknowledge message {message.delivery_tag} ({e}); the broker"
                f" keeps it", cause=e) from e

    def _publish_raw(self, msg_type: str, body: Any, routing_key: str | Sequence[str],
                     reply_to: str | None = None, correlation_id: str | None = None,
                     headers: Mapping[str, Any] | None = None,
                     timeout_s: float | None = None, settles: Any = None) -> None:
        """Encode ``body`` once, sign it if a key is set, and publish it."""
        try:
            payload = kombu_json.dumps(body).encode("utf-8")
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
        all_headers = dict(headers or {})
        if self._keyring is not None:
            all_headers.update(self._keyring.sign(payload, kwargs, all_headers))
        if all_headers:
            kwargs["headers"] = all_headers
        kwargs.update(topology.publish_properties(self._durable))
        timeout_s = self._publish_timeout_s if timeout_s is None else timeout_s
        settle_atomically = settles is not None and hasattr(settles.channel, "settle_with")
        if settles is not None and len(keys) != 1:
            raise ValueError("a publication that settles a message has one routing key")
        self._publish_with_retries(payload, keys, kwargs, time.monotonic() + timeout_s,
                                   settles if settle_atomically else None)
        if settles is not None and not settle_atomically:
            self.acknowledge(settles)

    def _publish_with_retries(self, payload: bytes, keys: list[str], kwargs: dict[str, Any],
                              deadline: float, settles: Any = None) -> None:
        """Publish to each key, reconnecting until ``deadline`` (monotonic s)."""
        pending = list(keys)
        failures = 0
        with self._publish_lock:
            while True:
                try:
                    producer = self._ensure_publisher(deadline)
                    if settles is not None:
                        self._publish_settling(producer, payload, pending[0], kwargs,
                                               settles)
                        pending.clear()
                    while pending:
                        producer.publish(payload, exchange=self._exchange,
                                         routing_key=pending[0], **kwargs)
                        pending.pop(0)  # never published twice after a retry
                    if failures:
                        LOG.info("Published to %s again after %d failed attempt(s)",
                                 self._uri, failures)
                    return
                except Exception as e:
                    # Start from a fresh connection next time instead of a broken one.
                    self._reset_publisher()
                    if not self._is_connection_error(e):
                        raise
                    failures += 1
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise exc.PublishTimeout(
                            f"Could not publish {kwargs['type']} message to {self._uri}"
                            f" (routing key {pending[0]!r}): broker unreachable for"
                            f" {failures} attempt(s); last error: {e}", cause=e) from e
                    if failures == 1:
                        LOG.warning("Publishing to %s failed (%s); retrying for up to"
                                    " %.1f s", self._uri, e, remaining)
                    pause = min(PUBLISH_BACKOFF_START_S * 2 ** (failures - 1),
                                PUBLISH_BACKOFF_MAX_S, remaining)
                    time.sleep(pause)  # backoff; the lock keeps other publishers queued

    def _publish_settling(self, producer: kombu.Producer, payload: bytes, routing_key: str,
                          kwargs: dict[str, Any], message: Any) -> None:
        """Publish and settle ``message`` in one server-side step (leasing transport).

        Idempotent, so the retry loop may repeat it after a lost answer.
        """
        channel = producer.channel
        with channel.capturing() as pushes:
            producer.publish(payload, exchange=self._exchange, routing_key=routing_key,
                             **kwargs)
        message.channel.settle_with(message.delivery_tag, pushes, channel.client)
        message._state = "ACK"  # settled above; kombu must not acknowledge it again

    def _is_connection_error(self, error: BaseException) -> bool:
        """True for errors a new connection may cure (broker down, connection lost)."""
        return isinstance(error, (OSError, kombu.exceptions.OperationalError,
                                  exc.BrokerUnavailable)
                          + tuple(self._conn.connection_errors))

    def _ensure_publisher(self, deadline: float) -> kombu.Producer:
        """Return the producer, connecting (one bounded attempt) if needed (lock held)."""
        if self._producer is None:
            remaining = max(0.1, deadline - time.monotonic())
            conn = self._conn.clone(
                connect_timeout=min(PUBLISH_CONNECT_TIMEOUT_S, remaining))
            try:
                conn.connect()
                # auto_declare: the exchange is declared again on every new
                # connection (it is gone after a restart of a transient broker).
                self._producer = kombu.Producer(conn.channel(), exchange=self._exchange,
                                                auto_declare=True)
            except Exception:
                try:
                    conn.release()
                except Exception:  # already broken
                    LOG.debug("Error closing a failed publisher connection", exc_info=True)
                raise
            self._pub_conn = conn
        return self._producer

    def _reset_publisher(self) -> None:
        """Drop the publishing connection (lock held)."""
        conn, self._pub_conn, self._producer = self._pub_conn, None, None
        if conn is not None:
            try:
                conn.release()
            except Exception:  # already broken; nothing more to do
                LOG.debug("Error closing publisher connection", exc_info=True)

    def _publisher_heartbeat(self) -> None:
        """Keep an idle publisher connection's AMQP heartbeats going (from the loop)."""
        if not self._publish_lock.acquire(blocking=False):
            return  # publishing right now: the connection is not idle
        try:
            conn = self._pub_conn
            if conn is not None and conn.supports_heartbeats:
                conn.heartbeat_check()
        except Exception as e:
            LOG.info("Publisher connection to %s lost (%s); reconnecting on next publish",
                     self._uri, e)
            self._reset_publisher()
        finally:
            self._publish_lock.release()

    def _log_connect_error(self, error: BaseException, interval: float) -> None:
        """kombu errback: record what failed (the loop logs it once per back-off step)."""
        self._report_problem(error)
        LOG.debug("Broker connection to %s failed (%s); retrying in %.1f s",
                  self._uri, error, interval)

    def _report_problem(self, error: BaseException) -> exc.FlowEngineError:
        """Classify ``error`` and wake wait_started(); the classified error."""
        problem = broker_errors.classify(error, self._uri, self._exchange_name, self._durable)
        with self._started_or_failed:
            self._problem = problem
            self._started_or_failed.notify_all()
        return problem

    def wait_started(self, timeout: float, unreachable_give_up_s: float
                     ) -> exc.BrokerConfigError | exc.BrokerUnavailable | None:
        """Wait until consuming; None then, else the broker problem that prevents it.

        Returns at once on a problem waiting cannot cure (BrokerConfigError),
        after ``unreachable_give_up_s`` of an unreachable broker, and at
        ``timeout`` in any case (the loop goes on trying until stop()).
        """
        now = time.monotonic()
        deadline = now + timeout
        unreachable_since: float | None = None
        with self._started_or_failed:
            while not self._running.is_set():
                problem = self._problem
                now = time.monotonic()
                if isinstance(problem, exc.BrokerConfigError):
                    return problem
                if problem is not None:
                    unreachable_since = unreachable_since or now
                    if now - unreachable_since >= unreachable_give_up_s:
                        return problem
                if now >= deadline:
                    return problem or exc.BrokerUnavailable(
                        f"could not start consuming from {self._uri} within {timeout:.0f} s")
                wake_at = deadline if unreachable_since is None else min(
                    deadline, unreachable_since + unreachable_give_up_s)
                self._started_or_failed.wait(max(0.0, wake_at - now))
        return None

    # --- consuming ---

    def start(self) -> None:
        """Run the consume loop in the calling thread until stop() is called."""
        if not self._loop_lock.acquire(blocking=False):
            raise RuntimeError(f"Proxy for topic {self._topic!r} is already running")
        self._stopping.clear()
        if self._lease is not None:
            self._lease.start()
        failures = 0  # in a row: each doubles the pause before the next attempt
        try:
            while not self._stopping.is_set():
                try:
                    self._consume_until_stopped()
                except Exception as e:
                    self._running.clear()
                    if self._stopping.is_set():
                        break
                    if self._lost_at is None:
                        self._lost_at = time.monotonic()
                    if self._consumed_since_failure:
                        failures = 0
                    self._consumed_since_failure = False
                    if isinstance(e, tuple(self._conn.channel_errors)) \
                            or self._is_connection_error(e):
                        # A wrong login or an exchange declared otherwise
                        # (PRECONDITION_FAILED) will not cure itself, but a
                        # worker keeps trying, slowly, while an operator fixes
                        # it; an engine gives up at once (wait_started).
                        problem = self._report_problem(e)
                        pause = min(RECONNECT_BACKOFF_MAX_S,
                                    RECONNECT_BACKOFF_S * 2 ** failures)
                        failures += 1
                        if self._has_consumed and isinstance(problem, exc.BrokerUnavailable):
                            LOG.error("Consumer connection to %s lost (%s); reconnecting in"
                                      " %.0f s", self._uri, e, pause)
                        else:
                            quiet = self._quiet_until_started and not self._has_consumed
                            LOG.log(logging.DEBUG if quiet else logging.ERROR,
                                    "%s; topic %r tries again in %.0f s", problem,
                                    self._topic, pause)
                        self._stopping.wait(pause)
                    else:
                        LOG.exception("Unexpected error in the consume loop of topic %r;"
                                      " restarting it", self._topic)
                        self._stopping.wait(UNEXPECTED_ERROR_BACKOFF_S)
        finally:
            self._running.clear()
            if self._lease is not None:
                # Nothing is consumed any more: holdings back, private queues gone.
                self._lease.stop(retire=True)
            # A publisher retrying through an outage holds the lock for up to
            # publish_timeout_s; the loop must end now all the same (that
            # publisher resets its own connection when it gives up).
            if self._publish_lock.acquire(blocking=False):
                try:
                    self._reset_publisher()
                finally:
                    self._publish_lock.release()
            self._loop_lock.release()

    def _kombu_queues(self) -> list[kombu.Queue]:
        """kombu queues for the specs (each bound with all its routing keys)."""
        return [topology.make_queue(spec.name, self._exchange, spec.routing_keys,
                                    auto_delete=spec.auto_delete, durable=self._durable)
                for spec in self._queue_specs]

    def _consume_until_stopped(self) -> None:
        """Connect, declare, consume and drain until stop() (raises on failures)."""
        conn = self._conn.clone()
        try:
            conn.ensure_connection(errback=self._log_connect_error, **self._retry_options)
            if self._lease is None:
                # kombu's own Redis transport (chosen by a dotted path): put
                # back what a Redis restart left parked between delivery and
                # acknowledgement. flowengine's puts back its own holdings.
                run_id = recovery.broker_run_id(conn)
                if self._lost_at is not None:
                    recovery.restore_stranded(conn, self._broker_run_id)
                self._broker_run_id = run_id
            consumers = self._start_consumers(conn)
            with self._started_or_failed:
                self._running.set()
                self._problem = None
                self._consumed_since_failure = True
                self._has_consumed = True
                self._started_or_failed.notify_all()
            LOG.debug("Consuming %s from %s", [q.name for q in self._queue_specs], self._uri)
            if self._lost_at is not None:
                self.last_outage_s = time.monotonic() - self._lost_at
                self.reconnect_count += 1
                self._lost_at = None
                LOG.warning("Consuming %s from %s again after %.1f s without a broker"
                            " connection", [q.name for q in self._queue_specs], self._uri,
                            self.last_outage_s)
            heartbeats = conn.supports_heartbeats and bool(conn.heartbeat)
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
                    if self._lease is not None and self._lease.lapsed():
                        # Others put back what we held and deleted our
                        # private queue: declare and consume everything again.
                        raise ConnectionResetError("this consumer's lease lapsed")
                    if not conn.connected:
                        # E.g. an ack failed on a dead broker inside a handler.
                        # Checked before anything touches conn.connection:
                        # kombu would silently open a *new* connection there,
                        # one without our consumer, and we would wait on it
                        # for ever.
                        raise ConnectionResetError("the consumer's broker connection broke")
                    if heartbeats:
                        # py-amqp sends and checks heartbeats only when asked;
                        # a dead broker raises here (the loop reconnects).
                        conn.heartbeat_check()
                        self._publisher_heartbeat()
                    now = time.monotonic()
                    if self._on_wait is not None and now - last_wait >= period:
                        last_wait = now
                        self._call_safely(self._on_wait, "on_wait")
            finally:
                self._running.clear()
                for consumer in consumers:
                    try:
                        consumer.cancel()
                    except Exception:
                        LOG.debug("Error cancelling consumer", exc_info=True)
        finally:
            try:
                conn.release()
            except Exception:
                LOG.debug("Error closing consumer connection", exc_info=True)

    def _start_consumers(self, conn: kombu.Connection) -> list[kombu.Consumer]:
        """Declare and consume the queues: on one channel, or one channel each."""
        queues = self._kombu_queues()
        per_channel = getattr(conn.transport, "one_queue_per_channel", False)
        groups = [[q] for q in queues] if per_channel else [queues]
        private = {spec.name for spec in self._queue_specs if spec.private}
        consumers = []
        for i, group in enumerate(groups):
            channel = conn.channel()
            if i == 0:
                self._exchange.declare(channel=channel)
            if hasattr(channel, "mark_private"):
                for queue in group:
                    if queue.name in private:
                        channel.mark_private(queue.name)
            consumer = kombu.Consumer(channel, queues=group, on_message=self._on_message,
                                      accept=["json"],
                                      on_decode_error=self._dispatcher.on_decode_error,
                                      prefetch_count=self._prefetch_count)
            consumer.consume()
            consumers.append(consumer)
        return consumers

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
            if self._keyring is not None:
                body = message.body
                if isinstance(body, str):
                    body = body.encode("utf-8")
                try:
                    self._keyring.verify(body, message.properties or {}, headers)
                except exc.UnverifiedMessage as e:
                    self._dispatcher.reject_unverified(message, str(e))
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
                                  headers={_WAKE_HEADER: self._wake_token},
                                  timeout_s=WAKE_PUBLISH_TIMEOUT_S)
            except Exception:
                # The loop still ends within ON_WAIT_PERIOD_S.
                LOG.debug("Could not send wake-up to topic %r", self._topic, exc_info=True)
