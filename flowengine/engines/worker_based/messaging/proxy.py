"""Proxy: publishes messages to, and consumes messages from, a named exchange.

TaskFlow's name for the pair every engine and worker holds: a
:class:`.publisher.Publisher` (any thread may publish, on a connection of
its own) and a :class:`.consumer.Consumer` (the supervised consume loop, in
the thread that calls start()), sharing one :class:`.settings.BrokerSettings`
and one exchange. With a signing key every message sent is signed and every
message received is verified before it is decoded (see ``wire/signing.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from kombu.connection import Connection

from flowengine import exceptions as exc
from flowengine.engines.worker_based.messaging import compat
from flowengine.engines.worker_based.messaging import dispatcher as dispatcher_mod
from flowengine.engines.worker_based.messaging.consumer import (
    DEFAULT_RETRY_OPTIONS,
    WAKE_TYPE,
    ConsumeOptions,
    Consumer,
    LeaseSpec,
    LoopObserver,
    QueueSpec,
)
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.messaging.proxy_options import ProxyOptions
from flowengine.engines.worker_based.messaging.publisher import (
    BatchNotSent,
    Outgoing,
    Publisher,
)
from flowengine.engines.worker_based.messaging.settings import BrokerSettings, mask_options
from flowengine.engines.worker_based.wire import messages, names, signing

LOG = logging.getLogger(__name__)

__all__ = [
    "BatchNotSent",
    "ConnectionDetails",
    "ConsumeOptions",
    "LeaseSpec",
    "LoopObserver",
    "Outgoing",
    "Proxy",
    "ProxyOptions",
    "QueueSpec",
    "TransportDetails",
    "mask_options",
]

#: Bound (s) on the wake-up stop() publishes: stop() must not wait out a
#: broker outage (the loop ends within its wait period anyway).
WAKE_PUBLISH_TIMEOUT_S = 1.0


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


class _PublisherUpkeep(LoopObserver):
    """Keeps the proxy's publisher alive while idle, and closes it with the loop."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher

    def after_round(self) -> None:
        self._publisher.heartbeat_if_idle()

    def after_loop_exit(self) -> None:
        self._publisher.close_if_idle()


class _OnWait(LoopObserver):
    """TaskFlow's ``on_wait`` callback, run every wait period."""

    def __init__(self, on_wait: Callable[[], object]) -> None:
        self._on_wait = on_wait

    def every_wait_period(self) -> None:
        self._on_wait()


class Proxy:
    """Handles messages to/from a named exchange (internal use, not public API).

    TaskFlow's first arguments (``topic``, ``exchange``, ``type_handlers``:
    the handler of each message type, ``on_wait()``: run in the loop at least
    every ``consume.wait_period_s``), then where the broker is (``broker``, a
    BrokerSettings; None: kombu's default broker) and ``options`` (a
    :class:`~.proxy_options.ProxyOptions`: the queues consumed, the wake-up
    routing key, the loop's other callbacks, how long publishing retries).
    TaskFlow's ``url``, ``transport``, ``transport_options`` and
    ``retry_options`` are still taken as keywords, instead of ``broker``.

    By default it consumes the queue ``<exchange>_<topic>`` bound with routing
    key ``topic`` (auto-deleted), plus the extra routing keys in
    ``options.bindings``; ``options.queues`` replaces that with an explicit
    list (a worker consumes its topic queue and its private queue).
    Callbacks' errors are logged, never fatal.
    """

    #: Reconnection settings (kombu ``ensure_connection`` options) used unless
    #: ``retry_options`` say otherwise.
    DEFAULT_RETRY_OPTIONS = DEFAULT_RETRY_OPTIONS

    def __init__(
        self,
        topic: str,
        exchange: str,
        type_handlers: Mapping[str, dispatcher_mod.Handler] | None = None,
        on_wait: Callable[[], Any] | None = None,
        *,
        broker: BrokerSettings | None = None,
        options: ProxyOptions = ProxyOptions(),
        **taskflow_broker: Any,
    ) -> None:
        broker = BrokerSettings.given_keywords("Proxy", broker, taskflow_broker)
        queues, wake_routing_key = options.queues, options.wake_routing_key
        self._topic = topic
        self._broker = broker
        if queues is None:
            keys = (topic, *[b for b in options.bindings if b != topic])
            queues = [QueueSpec(names.topic_queue_name(exchange, topic), keys, auto_delete=True)]
            if wake_routing_key is None:
                wake_routing_key = topic
        self._wake_routing_key = wake_routing_key
        self._dispatcher = dispatcher_mod.TypeDispatcher(
            type_handlers=type_handlers, on_reject=options.on_reject
        )
        # compat='taskflow': declared as TaskFlow does (see compat.py).
        self._exchange = compat.make_exchange(
            exchange,
            durable=broker.durable,
            compat=broker.compat,
            signed=broker.keyring is not None,
        )
        self._publisher = Publisher(
            broker,
            self._exchange,
            max_body_bytes=options.consume.body_limit(broker),
            timeout_s=options.publish_timeout_s,
        )
        observers: list[LoopObserver] = [_PublisherUpkeep(self._publisher)]
        if on_wait is not None:
            observers.append(_OnWait(on_wait))
        if options.observer is not None:
            observers.append(options.observer)
        self._consumer = Consumer(
            topic,
            broker,
            self._exchange,
            queues,
            self._dispatcher,
            options=options.consume,
            observers=observers,
            wait_for_room=options.wait_for_room,
        )

    # --- read-only facts ---

    @property
    def topic(self) -> str:
        """The topic (default queue suffix and routing key)."""
        return self._topic

    @property
    def exchange(self) -> str:
        """Name of the exchange messages go through."""
        return str(self._exchange.name)

    @property
    def broker(self) -> BrokerSettings:
        """Where the broker is and how this proxy talks to it."""
        return self._broker

    @property
    def queues(self) -> list[QueueSpec]:
        """The queues the consume loop reads."""
        return self._consumer.queues

    @property
    def dispatcher(self) -> dispatcher_mod.TypeDispatcher:
        """The dispatcher used internally to route each message by type."""
        return self._dispatcher

    @property
    def template_connection(self) -> Connection:
        """A connection to the broker, never connected: what transport it is, with no I/O."""
        return self._consumer.connection

    @property
    def connection_details(self) -> ConnectionDetails:
        """Connection details (read-only, password and secret options masked)."""
        transport = self._consumer.connection.transport
        return ConnectionDetails(
            uri=self._broker.public_uri,
            transport=TransportDetails(
                options=mask_options(self._broker.transport_options),
                driver_type=transport.driver_type,
                driver_name=transport.driver_name,
                driver_version=str(transport.driver_version()),
            ),
        )

    @property
    def durable(self) -> bool:
        """True when the exchange and queues are durable and messages persistent."""
        return self._broker.durable

    @property
    def keyring(self) -> signing.Keyring | None:
        """The keys messages are signed and verified with (None: signing off)."""
        return self._broker.keyring

    @property
    def unverified_count(self) -> int:
        """Messages refused because they were unsigned or badly signed."""
        return self._dispatcher.unverified_count

    @property
    def has_consumed(self) -> bool:
        """True once the consume loop has declared its queues and consumed (ever)."""
        return self._consumer.has_consumed

    @property
    def private_queues_deleted(self) -> bool:
        """True once the stopped loop's transport deleted its private queues (Redis)."""
        return self._consumer.private_queues_deleted

    @property
    def is_running(self) -> bool:
        """True while the consume loop is consuming."""
        return self._consumer.is_running

    @property
    def failing(self) -> str | None:
        """Why the consume loop keeps failing (its last error); None while it works."""
        return self._consumer.failing

    @property
    def dead_lettered(self) -> dict[str, int]:
        """Messages the consume loop dead-lettered so far, per dead-letter queue."""
        return self._consumer.dead_lettered

    @property
    def reconnect_count(self) -> int:
        """Consumer reconnections so far."""
        return self._consumer.reconnect_count

    @property
    def last_outage_s(self) -> float | None:
        """How long the last consumer outage lasted (s; None: none yet)."""
        return self._consumer.last_outage_s

    # --- publishing ---

    def publish(
        self,
        msg: messages.Message,
        routing_key: str | Sequence[str],
        reply_to: str | None = None,
        correlation_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        settles: Delivery | None = None,
    ) -> int:
        """Publish ``msg`` to the exchange with ``routing_key`` (or each of several).

        Thread-safe. While the broker is unreachable it keeps trying (new
        connection, exchange declared again) for ``timeout_s`` (default: the
        proxy's ``publish_timeout_s``). Raises SerializationFailure when the
        body cannot be encoded as JSON or is larger than the body limit,
        PublishTimeout (a recoverable BrokerUnavailable) when the broker stayed
        unreachable, and the transport's channel errors (e.g. a declaration
        conflicting with the broker's) as they are.

        ``settles``: a message received by this proxy's consume loop that this
        publication answers (call from the consume loop's thread). It is
        acknowledged with the publication: atomically on a transport that can
        (see ``transports/contract.py``), right after it elsewhere.
        DeliveryNotSettled when it could not be: the caller must then not act
        on it (the broker gives it again, or already gave it to another
        consumer).

        Returns the size of the encoded body (bytes).
        """
        return self._publisher.publish(
            msg.TYPE,
            msg.to_dict(),
            routing_key,
            reply_to=reply_to,
            correlation_id=correlation_id,
            headers=headers,
            timeout_s=timeout_s,
            settles=settles,
        )

    @property
    def publishing_fails(self) -> bool:
        """True while the broker answers publishing with errors (see Publisher.failing)."""
        return self._publisher.failing

    def keep_alive(self) -> None:
        """From a handler waiting long on the consume loop: keep the connection alive."""
        self._consumer.keep_alive()

    def confirm_published(self) -> bool:
        """Block until what was published so far reached the broker; False if unknown."""
        return self._publisher.confirm()

    def prepare(
        self,
        msg: messages.Message,
        routing_key: str | Sequence[str],
        reply_to: str | None = None,
        correlation_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Outgoing:
        """Encode (and sign) ``msg`` for send(); SerializationFailure as publish()."""
        return self._publisher.prepare(
            msg.TYPE,
            msg.to_dict(),
            routing_key,
            reply_to=reply_to,
            correlation_id=correlation_id,
            headers=headers,
        )

    @property
    def batches_publications(self) -> bool:
        """True when a batch given to send() costs one round trip (flowengine's Redis)."""
        return self._publisher.batches

    def send(self, batch: Sequence[Outgoing], timeout_s: float | None = None) -> None:
        """Publish prepared messages in order, in one round trip where the transport can.

        Thread-safe. Raises BatchNotSent (how many went out first, and its
        ``cause``: what publish() would raise).
        """
        self._publisher.send(batch, timeout_s)

    def connect_publisher(self) -> None:
        """Open the publishing connection now (never raises; see Publisher.connect)."""
        self._publisher.connect()

    def publish_body(
        self, msg_type: str, body: Any, routing_key: str | Sequence[str], **kwargs: Any
    ) -> None:
        """Publish a message body as it is (tests and tools sending raw bodies)."""
        self._publisher.publish(msg_type, body, routing_key, **kwargs)

    # --- consuming ---

    def wait_started(
        self, timeout: float, unreachable_give_up_s: float
    ) -> exc.BrokerConfigError | exc.BrokerUnavailable | None:
        """Wait until consuming; None then, else the broker problem that prevents it.

        See Consumer.wait_started.
        """
        return self._consumer.wait_started(timeout, unreachable_give_up_s)

    def start(self) -> None:
        """Run the consume loop in the calling thread until stop() is called."""
        self._consumer.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the proxy is consuming; False if ``timeout`` passed first."""
        return self._consumer.wait(timeout)

    def stop(self) -> None:
        """Ask the consume loop to end (it returns from start() promptly)."""
        running = self._consumer.is_running
        self._consumer.stop()
        if running and self._wake_routing_key is not None:
            try:
                self._publisher.publish(
                    WAKE_TYPE,
                    {},
                    self._wake_routing_key,
                    headers=self._consumer.wake_headers,
                    timeout_s=WAKE_PUBLISH_TIMEOUT_S,
                )
            except Exception:
                # The loop still ends within its wait period.
                LOG.debug("Could not send wake-up to topic %r", self._topic, exc_info=True)
