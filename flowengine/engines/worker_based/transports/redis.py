"""Redis kombu transport that loses no message when a consumer dies.

kombu's Redis transport takes a message with ``BRPOP``: from the moment Redis
answers until kombu records the message as unacknowledged, the message
exists only in the consumer's socket buffer and memory, so a consumer killed
then takes it with it; a recorded one waits ``visibility_timeout`` (an hour by
default) before anybody gets it again. Both cost a flow a request.

This subclass (used whenever flowengine is given a ``redis://`` URL) takes a
message with ``BLMOVE`` into an in-flight list of the consuming process
(Redis >= 6.2), so at every instant the message is in a queue or held by a
named consumer. Settling it (acknowledging, possibly together with a reply
published in the same server-side script) removes it from that list; a
consumer whose lease lapsed has its in-flight messages put back at the head
of their queues by the live ones (redis_consumers.py). Publishing and key
layout are kombu's own, so plain kombu Redis publishers and consumers (and
TaskFlow) share queues with it; message priorities are not supported.

A channel consumes reliably only when it consumes exactly one queue with
acknowledgements (BLMOVE takes one source); flowengine's proxy opens a
channel per queue. Other channels behave exactly as kombu's.

A private queue marked ``take_in_batches`` (only this process takes from
it, and handling one of its messages twice is harmless: an engine's reply
queue) and read without a prefetch limit is taken in batches: BLMOVE goes
out with an LLEN of the queue behind it (Redis runs it the moment BLMOVE
returns), and when more wait, one script moves up to TAKE_BATCH - 1 more and
settles what was acknowledged since the last take, so a burst of replies
costs about one round trip per batch instead of two per reply, and a lone
reply (a chain's) one round trip. An acknowledged reply stays in the
in-flight list until the next take: a burst, TAKE_BATCH acknowledged, or a
poll that finds the queue idle (at most one poll interval, 1 s). If the
connection breaks meanwhile, the consumer gets it again, which replies
tolerate (at least once, as before).

``rediss://`` URLs get this transport over TLS (a certificate that does not
verify fails at once: redis_tls.py); ``sentinel://`` URLs its Sentinel
variant (:class:`SentinelTransport`, kombu's spelling and options), whose
publications and settlements return once a replica has them
(flowengine.utils.redis_replicas), so that a failover loses none of them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from queue import Empty
from typing import Any, NamedTuple

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps
from kombu.utils.url import url_to_parts

from flowengine import exceptions as exc
from flowengine.engines.worker_based.transports import contract, redis_tls
from flowengine.engines.worker_based.transports import redis_consumers as rc
from flowengine.engines.worker_based.transports.envelope import read_envelope
from flowengine.utils import redis_identity, redis_replicas

LOG = logging.getLogger(__name__)

#: Oldest Redis server with BLMOVE/LMOVE.
MIN_SERVER_VERSION = (6, 2)

#: Most messages one poll takes from a private queue (see the module docstring).
TAKE_BATCH = 64

#: Servers (host, port) this process found recent enough: asked once, not
#: again by every channel (an engine opens new ones for each run).
_RECENT_ENOUGH: set[tuple[str, int]] = set()


class Held(NamedTuple):
    """A message this channel took and has not settled: where it sits, as taken."""

    inflight: str
    queue: str
    raw: bytes
    #: Drawn when taken: fences settling (see redis_consumers.py).
    nonce: str


def _given_away(delivery_tag: str, held: Held) -> exc.DeliveryNotSettled:
    """The error for settling a message that went to another consumer meanwhile."""
    return exc.DeliveryNotSettled(
        f"Message {delivery_tag} from queue {held.queue!r} was given to another"
        f" consumer (this one's lease had lapsed); it must not be handled here"
    )


class QoS(kombu_redis.QoS):
    """Acknowledgement by removal from the consumer's in-flight list."""

    def append(self, message: Any, delivery_tag: str) -> None:
        """Track a delivery locally (a held one needs no unacked-hash entry)."""
        if delivery_tag in self.channel.held:
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        """Settle a delivery; DeliveryNotSettled when another consumer was given it."""
        held = self.channel.held.pop(delivery_tag, None)
        if held is None:
            super().ack(delivery_tag)
            return
        if self.channel.takes_batches(held.queue):
            self.channel.settle_later(held)
            virtual.QoS.ack(self, delivery_tag)
            return
        try:
            with self.channel.conn_or_acquire() as client:
                settled = rc.settle(
                    self.channel.replicated(client),
                    held.inflight,
                    held.raw,
                    delivery_tag,
                    held.nonce,
                    [],
                    held.queue,
                )
        finally:
            virtual.QoS.ack(self, delivery_tag)
        if not settled:
            raise _given_away(delivery_tag, held)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Drop a delivery, or put it back at the head of its queue."""
        held = self.channel.held.pop(delivery_tag, None)
        if held is None:
            super().reject(delivery_tag, requeue=requeue)
            return
        try:
            with self.channel.conn_or_acquire() as client:
                if requeue:
                    rc.restore_one(client, held.inflight, held.queue, held.raw)
                else:
                    rc.settle(
                        client, held.inflight, held.raw, delivery_tag, held.nonce, [], held.queue
                    )
        finally:
            virtual.QoS.ack(self, delivery_tag)

    def restore_unacked(self, client: Any = None) -> None:
        """Put every unsettled delivery back at the head of its queue (channel closing).

        The newest first, so that the oldest ends up first in line again.
        """
        self._flush()
        with self.channel.conn_or_acquire(client) as client:
            self.channel.settle_deferred(client)
            for tag in reversed(list(self._delivered)):
                held = self.channel.held.pop(tag, None)
                if held is None:
                    self.restore_by_tag(tag, client=client)
                else:
                    rc.restore_one(client, held.inflight, held.queue, held.raw)
        self._delivered.clear()


class _Unlocked:
    """A value made once per instance, kept in the instance attribute of its name.

    Once made, the attribute is read straight from the instance (a non-data
    descriptor), with no lock. Two threads making it at once (a channel is
    used by one thread, so only in theory) both make one and the first kept
    is the one everybody gets.
    """

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self._make = make
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return instance.__dict__.setdefault(self._name, self._make(instance))


class Channel(kombu_redis.Channel):
    """kombu's Redis channel taking messages with BLMOVE into an in-flight list."""

    QoS = QoS
    # One list per queue: BLMOVE has a single source.
    priority_steps = [0]
    # kombu's cached_property takes one lock, shared by every channel of the
    # process, on each read, cached or not (functools' too, on a miss); every
    # poll reads ``client`` a few times. With hundreds of channels opening and
    # polling in their own threads (an engine per concurrent run), they queued
    # on that lock behind threads the GIL had paused: 400 concurrent runs spent
    # 30 ms of CPU per task and 1,000 mostly failed to start consuming.
    client = _Unlocked(kombu_redis.Channel.client.func)
    subclient = _Unlocked(kombu_redis.Channel.subclient.func)
    #: Replicas a publication or settlement waits for unless the transport
    #: options say otherwise (see redis_replicas.py): none for a lone server.
    default_wait_replicas = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(*args, **kwargs)  # connects (PING)
        except Exception as e:
            problem = redis_tls.tls_problem(e, self.where, self.through_sentinel)
            if problem is not None:
                raise problem from e
            raise
        if self.global_keyprefix:
            raise ValueError(
                "flowengine's Redis transport does not support"
                " global_keyprefix; use transport"
                " 'kombu.transport.redis:Transport' to keep it"
            )
        options = self.connection.client.transport_options or {}
        self.consumer_id = str(options.get(rc.CONSUMER_OPTION) or uuid.uuid4().hex)
        self.lease_ms = int(float(options.get(rc.LEASE_OPTION, rc.DEFAULT_LEASE_S)) * 1000)
        self.replica_wait = redis_replicas.shared(
            self.where,
            int(options.get(redis_replicas.REPLICAS_OPTION, self.default_wait_replicas)),
            float(options.get(redis_replicas.TIMEOUT_OPTION, redis_replicas.DEFAULT_TIMEOUT_S)),
        )
        #: Deliveries taken and not settled yet, by delivery tag.
        self.held: dict[str, Held] = {}
        self._reliable: set[str] = set()
        self._private: set[str] = set()
        self._batched: set[str] = set()
        self._polling: str | None = None
        #: Whether the poll in flight sent LLEN behind its BLMOVE (its answer
        #: must be read, whatever takes_batches says by then).
        self._polling_length = False
        #: Acknowledged deliveries of private queues, settled with the next take.
        self._deferred: list[Held] = []
        self._server_checked = False
        self._captured: list[rc.Push] | None = None
        self._pooled_client: Any = None

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        """kombu's connection parameters, and RESP2 and who we are (see redis_identity).

        An engine opens three connections per ``run()``: what each costs
        before its first command counts. The asynchronous pool, which every
        command borrows from (see conn_or_acquire), may hold one more than
        ``max_connections``: the one consuming keeps to itself.
        """
        params: dict[str, Any] = super()._connparams(asynchronous)
        params.update(redis_identity.connection_kwargs())
        if asynchronous and params.get("max_connections"):
            params["max_connections"] += 1
        return params

    def close(self) -> None:
        """Settle what was acknowledged and not settled yet, then close as kombu does."""
        if self._deferred and not self.closed:
            # On a dead connection they stay held and come back when this
            # consumer consumes again: replies tolerate that.
            with contextlib.suppress(*self.connection_errors):
                with self.conn_or_acquire() as client:
                    self.settle_deferred(client)
        super().close()

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """``client``, or the channel's client borrowing from its asynchronous pool.

        kombu builds a new redis-py client for every command here, which
        costs more CPU than the command (redis-py fills a table of ~170
        reply callbacks per client). A client only borrows a pooled
        connection per command, so one per channel (and pool) serves all
        its threads.

        kombu opens a channel with a PING through its asynchronous pool (the
        one consuming takes its connection from, for good, when it starts)
        and sends other commands through a second pool: every channel would
        open a second connection at its first command. Borrowing from the
        first pool instead, a channel's commands use the connection its
        opening made for as long as nothing holds it (a publisher's, and a
        consumer's declarations before it consumes); commands sent while it
        is held get a connection of their own from the same pool.
        """
        if client:
            yield client
            return
        pooled = self._pooled_client
        if pooled is None or pooled.connection_pool is not self._async_pool:
            # Not the cached ``client``: consuming pins its connection.
            pooled = self._pooled_client = self._create_client(asynchronous=True)
        yield pooled

    def replicated(self, client: Any) -> Any:
        """``client``, its publishing and settling scripts waiting for replicas if asked."""
        return redis_replicas.replicated(client, self.replica_wait, self.where)

    #: Whether the master is looked up through Sentinels.
    through_sentinel = False

    @property
    def where(self) -> str:
        """The server, as logs and errors name it (never a password)."""
        conninfo = self.connection.client
        scheme = "rediss" if conninfo.ssl else "redis"
        return f"{scheme}://{conninfo.hostname}:{conninfo.port or self.connection.default_port}"

    # --- queues ---

    def mark_private(self, queue: str) -> None:
        """``queue`` is this consumer's alone: delete it (and its bindings) with it."""
        self._private.add(queue)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        super()._queue_bind(exchange, routing_key, pattern, queue)
        if queue not in self._private:
            return
        member = self.sep.join([routing_key or "", pattern or "", queue or ""])
        set_keys = [self.keyprefix_queue % (exchange,)]
        permanent = getattr(self, "keyprefix_binding_permanent", None)
        if permanent:
            set_keys.append(permanent % (exchange,))
        with self.conn_or_acquire() as client:
            rc.mark_private(client, self.consumer_id, queue, [(key, member) for key in set_keys])

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        no_ack = kwargs.get("no_ack", args[0] if args else False)
        if not no_ack and queue not in self._fanout_queues:
            self._check_server()
            with self.conn_or_acquire() as client:
                back = rc.register_queue(client, self.consumer_id, queue, self.lease_ms)
            if back:
                LOG.warning(
                    "Put back %d message(s) consumer %s took from %r on an earlier"
                    " connection and never settled",
                    back,
                    self.consumer_id,
                    queue,
                )
            self._reliable.add(queue)
        return super().basic_consume(queue, *args, **kwargs)

    def _check_server(self) -> None:
        """Fail clearly (once per channel and server) on a Redis without BLMOVE."""
        if self._server_checked:
            return
        server = (str(self.connection.client.hostname), int(self.connection.client.port or 0))
        if server in _RECENT_ENOUGH:
            self._server_checked = True
            return
        with self.conn_or_acquire() as client:
            version = str(client.info("server").get("redis_version", "0"))
        parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if parts < MIN_SERVER_VERSION:
            raise RuntimeError(
                f"Redis {version} is too old for flowengine's Redis transport (it needs"
                f" {'.'.join(map(str, MIN_SERVER_VERSION))}+ for BLMOVE); upgrade Redis or"
                f" pass transport='kombu.transport.redis:Transport'"
            )
        self._server_checked = True
        _RECENT_ENOUGH.add(server)

    # --- taking messages ---

    def take_in_batches(self, queue: str) -> None:
        """Take private ``queue`` several messages per round trip, settling lazily."""
        self._batched.add(queue)

    def takes_batches(self, queue: str) -> bool:
        """Whether ``queue`` is taken in batches and settled lazily (module docstring)."""
        return queue in self._batched and not self.qos.prefetch_count

    def settle_later(self, held: Held) -> None:
        """Settle an acknowledged delivery of a batch-taken queue with the next take."""
        self._deferred.append(held)

    def settle_deferred(self, client: Any) -> None:
        """Settle every acknowledged delivery waiting for a take, now (via ``client``)."""
        for queue in {held.queue for held in self._deferred}:
            self._take(client, queue, 0)

    def _take(self, client: Any, queue: str, limit: int) -> list[bytes]:
        """Settle ``queue``'s deferred deliveries and take up to ``limit`` more."""
        settled = [held for held in self._deferred if held.queue == queue]
        taken = rc.take(
            client,
            queue,
            rc.inflight_key(self.consumer_id, queue),
            limit,
            [held.raw for held in settled],
        )
        if settled:
            self._deferred = [held for held in self._deferred if held.queue != queue]
        return taken

    def _reliable_queue(self) -> str | None:
        """The one queue this channel takes from reliably, or None (kombu's way)."""
        queues = self.active_queues
        if len(queues) != 1:
            return None
        queue = next(iter(queues))
        return queue if queue in self._reliable else None

    def _brpop_start(self, timeout: float | None = None) -> None:
        queue = self._reliable_queue()
        self._polling = queue
        if queue is None:
            super()._brpop_start(timeout)
            return
        if timeout is None:
            timeout = getattr(self, "brpop_timeout", 1)
        self._in_poll = self.client.connection
        # kombu's half-open socket check (kombu declares the attribute None).
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]
        blmove = ("BLMOVE", queue, rc.inflight_key(self.consumer_id, queue), "RIGHT", "LEFT")
        connection = self.client.connection
        self._polling_length = self.takes_batches(queue)
        if self._polling_length:
            # LLEN runs the moment BLMOVE returns (Redis queues a blocked
            # client's next command): whether a take is worth its round trip.
            connection.send_packed_command(
                connection.pack_commands([(*blmove, timeout or 0), ("LLEN", queue)])
            )
        else:
            connection.send_command(*blmove, timeout or 0)

    def _brpop_read(self, **options: Any) -> bool:
        queue = self._polling
        if queue is None:
            return bool(super()._brpop_read(**options))
        try:
            batches = self._polling_length
            connection = self.client.connection
            try:
                item = self.client.parse_response(connection, "BLMOVE", **options)
                waiting = int(self.client.parse_response(connection, "LLEN")) if batches else 0
            except self.connection_errors:
                # The next poll reconnects; what BLMOVE moved stays held and is
                # put back when this consumer consumes again.
                connection.disconnect()
                raise
            except Exception:
                if batches:  # an error answer: LLEN's may still be unread
                    connection.disconnect()
                raise
            if item is None:
                if batches and self._deferred:
                    with self.conn_or_acquire() as client:
                        self._take(client, queue, 0)  # idle: settle what was handled
                raise Empty()
            items = [item]
            # A lone reply (a chain's) costs no take: what was handled is
            # settled with the next burst, once TAKE_BATCH wait, or when idle.
            if batches and (waiting or len(self._deferred) >= TAKE_BATCH):
                with self.conn_or_acquire() as client:
                    items += self._take(client, queue, TAKE_BATCH - 1 if waiting else 0)
            delivered = [self._deliver_taken(queue, taken) for taken in items]
            if not any(delivered):
                raise Empty()
            return True
        finally:
            # As kombu resets it (it declares the attribute a bool).
            self._in_poll = None  # type: ignore[assignment]
            self._polling = None
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _deliver_taken(self, queue: str, item: bytes) -> bool:
        """Hold and deliver one message taken from ``queue`` (False: undecodable, dropped)."""
        inflight = rc.inflight_key(self.consumer_id, queue)
        try:
            payload = read_envelope(bytes_to_str(item))
            tag = payload["properties"]["delivery_tag"]
        except Exception:
            # Unreadable: settle it away rather than put back a poison message.
            with self.conn_or_acquire() as client:
                rc.settle(client, inflight, item, uuid.uuid4().hex, uuid.uuid4().hex, [])
            LOG.error("Dropped an undecodable message from Redis queue %r: %.200r", queue, item)
            return False
        self.held[tag] = Held(inflight, queue, item, uuid.uuid4().hex)
        self.connection._deliver(payload, queue)
        return True

    # --- publishing ---

    def basic_publish(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> Any:
        """Publish; to a direct exchange in one round trip, Redis doing the routing.

        kombu looks the exchange's bindings up (SMEMBERS) and then pushes to
        each bound queue: two round trips, and a binding removed in between
        still receives the message. Here one script does both, atomically.
        Other exchange types (and a dead-letter queue) go kombu's way.
        """
        if (
            not exchange
            or self.deadletter_queue is not None
            or self.sep != rc.BINDING_SEP
            or self.typeof(exchange).type != "direct"
        ):
            return super().basic_publish(message, exchange, routing_key, **kwargs)
        self._inplace_augment_message(message, exchange, routing_key)
        push = rc.Push(self.keyprefix_queue % (exchange,), routing_key or "", dumps(message))
        if self._captured is not None:
            self._captured.append(push)
            return None
        with self.conn_or_acquire() as client:
            rc.publish(self.replicated(client), [push])
        return None

    def _inplace_augment_message(self, message: Any, exchange: str, routing_key: str) -> None:
        """kombu's, keeping a delivery tag the publisher chose (the same when sending again).

        A copy sent again after a lost answer then carries the first one's
        tag, and only one copy is ever settled (see redis_consumers.py).
        """
        tag = message["properties"].get("delivery_tag")
        super()._inplace_augment_message(message, exchange, routing_key)
        if tag:
            message["properties"]["delivery_tag"] = tag

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        if self._captured is not None:
            self._captured.append(rc.Push("", self._q_for_pri(queue, 0), dumps(message)))
            return
        super()._put(queue, message, **kwargs)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[list[rc.Push]]:
        """Collect what is published meanwhile (as Push) instead of pushing it."""
        if self._captured is not None:
            raise RuntimeError("capturing() or batching() inside capturing() or batching()")
        captured: list[rc.Push] = []
        self._captured = captured
        try:
            yield captured
        finally:
            self._captured = None

    @contextlib.contextmanager
    def batching(self) -> Iterator[None]:
        """Publish the block's messages in one round trip when it ends (see contract.py).

        One script pushes them all, in order and atomically; nothing is pushed
        when the block raises. When the script's answer is lost the caller
        cannot know whether the batch went out (as with a single push).
        """
        with self.capturing() as pushes:
            yield
        if pushes:
            with self.conn_or_acquire() as client:
                rc.publish(self.replicated(client), pushes)

    # --- settling with a reply ---

    def settle_with(
        self, delivery_tag: str, pushes: Sequence[rc.Push | tuple[str, bytes]], client: Any
    ) -> None:
        """Settle a held delivery and make ``pushes`` in one atomic step (via ``client``).

        ``pushes``: what capturing() collected, or (queue, payload) pairs.
        Raises DeliveryNotSettled when another consumer was given it; the
        transport's connection errors as they are (the delivery stays held:
        retry, it is idempotent). Settled deliveries are forgotten locally.
        """
        held = self.held.get(delivery_tag)
        if held is None:
            raise exc.DeliveryNotSettled(
                f"Message {delivery_tag} is not held by this channel (already settled?)"
            )
        settled = rc.settle(
            self.replicated(client),
            held.inflight,
            held.raw,
            delivery_tag,
            held.nonce,
            pushes,
            held.queue,
        )
        del self.held[delivery_tag]
        virtual.QoS.ack(self.qos, delivery_tag)
        if not settled:
            raise _given_away(delivery_tag, held)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with reliable consumption (see the module docstring)."""

    Channel = Channel
    #: See contract.py: proxies open one channel per consumed queue, keep a
    #: lease alive, mark private queues and settle a request with its reply.
    flowengine_implements = contract.Capabilities(
        leases=True,
        queue_per_channel=True,
        private_queues=True,
        atomic_settle=True,
        batch_publish=True,
        batch_take=True,
    )


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """The reliable channel above, reaching the master through Redis Sentinel.

    kombu's ``sentinel://`` spelling and options (``master_name``,
    ``sentinel_kwargs``, ``min_other_sentinels``): every Sentinel of the URL
    list is asked for the master, again after each broken connection, so
    consumers and publishers follow a failover. Its publications and
    settlements wait for one replica by default (see redis_replicas.py).
    """

    default_wait_replicas = 1
    through_sentinel = True

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        conninfo = connection.client
        sentinels = []
        for url in conninfo.alt or [conninfo.as_uri(include_password=True)]:
            parts = url_to_parts(url)
            sentinels.append(
                (parts.hostname or "127.0.0.1", int(parts.port or _sentinel_default_port()))
            )
        options = conninfo.transport_options or {}
        redis_tls.check_sentinels(
            sentinels, options.get("sentinel_kwargs"), str(options.get("master_name"))
        )
        super().__init__(connection, **kwargs)

    @property
    def where(self) -> str:
        """The service, as logs and errors name it: its master moves."""
        master = self.connection.client.transport_options.get("master_name")
        return f"the master of {master!r} (Redis Sentinel)"


def _sentinel_default_port() -> int:
    """A Sentinel's port when its URL names none."""
    return int(kombu_redis.SentinelTransport.default_port)


class SentinelTransport(Transport):
    """flowengine's Redis transport through Redis Sentinel (``sentinel://`` URLs)."""

    Channel = SentinelChannel
    default_port = kombu_redis.SentinelTransport.default_port  # type: ignore[assignment]
