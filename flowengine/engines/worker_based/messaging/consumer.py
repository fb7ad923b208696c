"""The consume loop: connect, declare, consume, dispatch; survive everything until stopped.

The loop is a plain loop in the thread that calls :meth:`Consumer.start`
(a worker gives each topic a thread of its own for it, an engine its reply
consumer's thread); only that thread uses its connection. It is
supervised: a failing handler, an undecodable message or a broken
connection is logged and survived (reconnect, re-declare, re-consume) until
:meth:`Consumer.stop`. Every received message is size-checked, verified
(when signing is on) and decoded before the dispatcher sees it, and settled
exactly once (see :mod:`.delivery`).

Nothing a publisher sends can stop the loop: kombu builds every message
without raising (:mod:`.guarded`), and every message refused at any layer
is copied into a dead-letter queue with its reason, then acknowledged
(:mod:`.dead_letters`). A message in hand when the loop itself failed is
remembered (:mod:`.strikes`) and dead-lettered unread once it made the loop
fail ``max_redeliveries`` times. A loop that keeps failing says so
(``LoopObserver.after_failing_change``, :attr:`Consumer.failing`): a worker then stops
announcing itself, so engines route around it.

On a leasing transport (flowengine's Redis transport) each queue is consumed
on a channel of its own and a LeaseKeeper keeps this consumer's lease alive
(see ``transports/leases.py``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kombu.connection import Connection
from kombu.entity import Exchange
from kombu.messaging import Consumer as KombuConsumer

from flowengine import exceptions as exc
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging import guarded
from flowengine.engines.worker_based.messaging.dead_letters import (
    DeadLetters,
    dead_letter_queue_name,
)
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.messaging.dispatcher import TypeDispatcher, describe
from flowengine.engines.worker_based.messaging.in_turn import InTurn
from flowengine.engines.worker_based.messaging.keepalive import Keepalive
from flowengine.engines.worker_based.messaging.publisher import check_period, is_connection_error
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.messaging.strikes import Strikes
from flowengine.engines.worker_based.transports import (
    contract,
    errors,
    failover,
    leases,
    recovery,
    redis_consumers,
    topology,
)
from flowengine.engines.worker_based.wire import names

LOG = logging.getLogger(__name__)

__all__ = [
    "ON_WAIT_PERIOD_S",
    "ConsumeOptions",
    "Consumer",
    "LeaseSpec",
    "LoopObserver",
    "QueueSpec",
]

#: Longest time (s) the consume loop blocks in drain_events before it checks
#: for stop() and runs every_wait_period. Messages never wait on it: drain_events
#: returns as soon as one arrives. Short so periodic work (request
#: expiry) stays timely and stop() is prompt even when no wake-up gets through.
ON_WAIT_PERIOD_S = 0.5

#: Pause (s) before reconnecting after a failed connection attempt; the loop
#: then tries again (it only ends on stop(), which ends a pause at once).
#: Each further failure in a row doubles the pause up to
#: RECONNECT_BACKOFF_MAX_S, so a broker that stays away costs one log line
#: per step, not one per second; the cap keeps the recovery after a long
#: outage within seconds of the broker's return.
RECONNECT_BACKOFF_S = 1.0
RECONNECT_BACKOFF_MAX_S = 16.0

#: Pause (s) after an unexpected (non-connection) error in the loop, so a
#: persistent fault cannot spin a CPU at 100 %; doubled for each further one
#: in a row, up to RECONNECT_BACKOFF_MAX_S.
UNEXPECTED_ERROR_BACKOFF_S = 0.1

#: Unexpected errors in a row (none separated by a wait period of consuming
#: without one) after which the loop counts as failing (Consumer.failing).
FAILING_AFTER_ERRORS = 3

#: TaskFlow's reconnection settings (kombu ``ensure`` options), kept by name
#: for TaskFlow programs that read or pass them. flowengine's consume loop
#: does not wait inside kombu (kombu's pauses cannot be interrupted, so a
#: stop() would wait them out): it makes one attempt at a time and pauses
#: itself (RECONNECT_BACKOFF_S), and publishing retries for its own timeout.
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

#: Message type of the private wake-up message stop() sends to its own queue.
WAKE_TYPE = "FLOWENGINE_PROXY_WAKE"
WAKE_HEADER = "flowengine_proxy_wake"


class QueueSpec(NamedTuple):
    """A queue the consumer reads: its name, routing keys and lifetime.

    ``private``: only this process consumes it, so it may be deleted when
    the process is gone (leasing transports do; AMQP's auto_delete does).
    ``batched``: a private queue of messages that may be handled twice
    (replies), which a transport may take several at a time and settle
    lazily (Redis: one round trip per batch instead of two per message).
    On AMQP a private, batched, auto-delete, transient queue is consumed
    without acknowledgements: an acknowledgement would cost a frame per
    message and could bring back only what was in flight to a connection
    as it broke (the broker deletes such a queue, with whatever it holds,
    when its consumer's channel closes, or the broker restarts). A durable
    one is acknowledged.
    ``outlives_connection``: on AMQP an auto-delete transient queue is
    declared to expire a while after its consumer went instead
    (topology.RECONNECT_GRACE_S), so what is sent to it while its consumer
    reconnects waits there; the loop deletes it itself on stop().
    """

    name: str
    routing_keys: tuple[str, ...]
    auto_delete: bool = False
    private: bool = False
    batched: bool = False
    outlives_connection: bool = False


class LeaseSpec(NamedTuple):
    """This consumer's lease on a leasing transport (ignored on the others).

    ``consumer_id`` names the holder of what it takes (None: a fresh id);
    ``lease_s`` is how long its holdings survive without a renewal;
    ``reclaim``: it also puts back what dead consumers held.
    """

    consumer_id: str | None = None
    lease_s: float = redis_consumers.DEFAULT_LEASE_S
    reclaim: bool = False


class DefaultLimit(enum.Enum):
    """``ConsumeOptions.max_body_bytes``'s default: the broker settings' limit."""

    BROKER = "broker"


@dataclasses.dataclass(frozen=True)
class ConsumeOptions:
    """How a consume loop behaves; the defaults suit an engine's reply queue.

    ``prefetch_count``: unacknowledged messages the broker may push per
    queue (None: no limit). ``wait_period_s``: how often the observers'
    ``every_wait_period`` runs.
    ``max_body_bytes``: larger messages are refused unread (default: the
    broker settings' limit; None there is no limit).
    ``quiet_until_started``: broker problems before the first start are
    logged at DEBUG (the owner raises them, see :meth:`Consumer.wait_started`).
    """

    prefetch_count: int | None = None
    wait_period_s: float = ON_WAIT_PERIOD_S
    max_body_bytes: int | None | DefaultLimit = DefaultLimit.BROKER
    quiet_until_started: bool = False
    lease: LeaseSpec = LeaseSpec()

    def body_limit(self, broker: BrokerSettings) -> int | None:
        """The largest body (bytes) taken: ``max_body_bytes``, or the broker settings' limit."""
        if isinstance(self.max_body_bytes, DefaultLimit):
            return broker.max_body_bytes
        return self.max_body_bytes


class LoopObserver:
    """Hears of a consume loop's life; every method is a no-op here.

    All are called in the loop's thread; their errors are logged, never
    fatal. A worker's observer hands them to its middleware
    (:mod:`..worker_side.middleware`).
    """

    def after_consume_start(self) -> None:
        """Consuming (re)started: the queues are declared and consumed."""

    def every_wait_period(self) -> None:
        """The loop ran for another ``wait_period_s`` (called at least that often)."""

    def after_round(self) -> None:
        """The loop finished one round (a wait for messages and their handling)."""

    def after_loop_exit(self) -> None:
        """The loop has ended (once per start())."""

    def after_failing_change(self, reason: str | None) -> None:
        """The loop started failing (``reason``: its last error), or recovered (None).

        See :attr:`Consumer.failing`.
        """


#: LoopObserver's hooks (see Consumer._notify).
_HOOKS = tuple(name for name in vars(LoopObserver) if not name.startswith("_"))


def _overrides(observer: Any, hook: str) -> bool:
    """Whether ``observer`` does more in ``hook`` than LoopObserver's no-op."""
    if hook in getattr(observer, "__dict__", {}):
        return True
    return getattr(type(observer), hook, None) is not getattr(LoopObserver, hook)


class Consumer:
    """Consumes ``queues`` bound to ``exchange`` and hands each message to ``dispatcher``.

    ``name`` says whose loop it is in logs (a topic or an executor id);
    ``observers`` hear of the loop's life, in order (see LoopObserver).
    ``wait_for_room(seconds)`` (flow control, a worker's): waits up to that
    long for room to take another message, True when there is; while it
    says False the loop takes no message but keeps its connection alive
    (see :mod:`.keepalive`) and keeps calling the observers.
    """

    def __init__(
        self,
        name: str,
        broker: BrokerSettings,
        exchange: Exchange,
        queues: Sequence[QueueSpec],
        dispatcher: TypeDispatcher,
        *,
        options: ConsumeOptions = ConsumeOptions(),
        observers: Sequence[LoopObserver] = (),
        wait_for_room: Callable[[float], bool] | None = None,
    ) -> None:
        self._name = name
        self._broker = broker
        self._exchange = exchange
        self._queues = list(queues)
        self._dispatcher = dispatcher
        self._options = options
        self._observers = list(observers)
        # The observers that do something in each hook: a round calls
        # after_round once per message, and most observers leave it a no-op.
        self._observing: dict[str, tuple[Any, ...]] = {
            hook: tuple(o for o in self._observers if _overrides(o, hook)) for hook in _HOOKS
        }
        self._wait_for_room = wait_for_room
        self._conn = broker.connection()  # no I/O: a template to clone
        self._uri = broker.public_uri
        # The node consumed from (one URL of a failover list), for logs.
        self._node_uri = self._uri
        self._caps = contract.capabilities(self._conn)
        self._lease: leases.LeaseKeeper | None = None
        if self._caps.leases:
            consumer_id = options.lease.consumer_id or uuidlib.uuid4().hex
            self._conn = broker.connection(
                {
                    redis_consumers.CONSUMER_OPTION: consumer_id,
                    redis_consumers.LEASE_OPTION: options.lease.lease_s,
                }
            )
            self._lease = leases.LeaseKeeper(
                self._conn, consumer_id, options.lease.lease_s, options.lease.reclaim
            )
        # Each (re)connection tries the URL that answered last, then the other
        # nodes of a failover list (see transports/failover.py).
        self._failover = failover.Failover(self._conn)
        self._wake_token = uuidlib.uuid4().hex
        self._running = threading.Event()
        self._stopping = threading.Event()
        self._loop_lock = threading.Lock()
        # The last broker problem since consuming last (re)started, classified;
        # the condition wakes wait_started() on it and on consuming.
        self._problem: exc.BrokerConfigError | exc.BrokerUnavailable | None = None
        self._started_or_failed = threading.Condition()
        self._consumed_since_failure = False
        self._has_consumed = False
        # Private auto-delete queues, and whether a clean stop deleted them
        # itself (a transport that keeps auto-delete queues, no lease).
        self._own_queues = {spec.name for spec in self._queues if spec.private and spec.auto_delete}
        # Transient auto-delete queues declared to outlive their connection
        # on RabbitMQ (a durable one has its own idle expiry: topology).
        self._outliving_queues = (
            set()
            if broker.durable
            else {
                spec.name for spec in self._queues if spec.auto_delete and spec.outlives_connection
            }
        )
        self._own_queues_dropped = False
        #: Reconnections so far, and how long the last outage lasted (s, from
        #: the error to consuming again); for logs, tests and stats.
        self.reconnect_count = 0
        self.last_outage_s: float | None = None
        self._lost_at: float | None = None
        # Which Redis server process we last consumed from (None off Redis).
        self._broker_run_id: str | None = None
        # The draining connection's keepalive and the loop's thread: only
        # that thread may use the connection (see keep_alive()).
        self._keepalive: tuple[int, Keepalive] | None = None
        exchange_name = str(exchange.name)
        routes = {
            key: (spec.name, dead_letter_queue_name(spec.name, exchange_name, spec.private))
            for spec in reversed(self._queues)
            for key in spec.routing_keys
        }
        first = self._queues[0] if self._queues else QueueSpec(exchange_name, ())
        self._dead_letters = DeadLetters(
            exchange,
            broker.durable,
            routes,
            (first.name, dead_letter_queue_name(first.name, exchange_name, first.private)),
            f"{name} on {names.make_origin()}",
            broker.queue_type,
        )
        self._strikes = Strikes(broker.max_redeliveries)
        self._max_body_bytes = options.body_limit(broker)
        # The message being handled, while it is (see _loop: a loop error
        # with a message in hand counts against that message).
        self._in_hand: Delivery | None = None
        self._in_turn = InTurn()
        # Unexpected errors in a row, and why the loop counts as failing.
        self._unexpected_errors = 0
        #: None while the loop works; the last error once it keeps failing.
        self.failing: str | None = None

    # --- facts ---

    @property
    def queues(self) -> list[QueueSpec]:
        """The queues the loop reads."""
        return list(self._queues)

    @property
    def connection(self) -> Connection:
        """The template connection (not connected) the loop's connections are cloned from."""
        return self._conn

    @property
    def is_running(self) -> bool:
        """True while the loop is consuming."""
        return self._running.is_set()

    @property
    def has_consumed(self) -> bool:
        """True once the loop has declared its queues and consumed (ever)."""
        return self._has_consumed

    @property
    def private_queues_deleted(self) -> bool:
        """True once the loop ended and its private queues went with it.

        With their consumer's lease (Redis), or deleted by a clean stop on a
        transport that ignores auto-delete (memory, filesystem) or, on
        RabbitMQ, a queue that outlives its connection (QueueSpec).
        """
        return self._own_queues_dropped or (self._lease is not None and self._lease.retired)

    @property
    def dead_lettered(self) -> dict[str, int]:
        """How many messages this loop dead-lettered, per dead-letter queue."""
        return dict(self._dead_letters.counts)

    @property
    def wake_headers(self) -> dict[str, str]:
        """Headers of the wake-up message that makes this loop notice stop() at once."""
        return {WAKE_HEADER: self._wake_token}

    # --- life cycle ---

    def start(self) -> None:
        """Run the loop in the calling thread until stop() is called."""
        if not self._loop_lock.acquire(blocking=False):
            raise RuntimeError(f"the consumer of {self._name!r} is already running")
        self._stopping.clear()
        self._loop()

    def _loop(self) -> None:
        """Consume, reconnecting after each failure (paused), until stop()."""
        if self._lease is not None:
            self._lease.start()
        failures = 0  # in a row: each doubles the pause before the next attempt
        try:
            while not self._stopping.is_set():
                try:
                    self._consume_until_stopped()
                except Exception as e:
                    self._running.clear()
                    in_hand, self._in_hand = self._in_hand, None
                    if self._stopping.is_set():
                        break
                    if self._lost_at is None:
                        self._lost_at = time.monotonic()
                    if self._consumed_since_failure:
                        failures = 0
                    self._consumed_since_failure = False
                    # A transport may say itself that waiting cannot help
                    # (a TLS certificate that does not verify): reported as such.
                    if isinstance(
                        e, (exc.BrokerConfigError, *self._conn.channel_errors)
                    ) or is_connection_error(e, self._conn):
                        self._back_off(e, failures)
                        failures += 1
                    else:
                        self._unexpected_error(e, in_hand)
        finally:
            self._running.clear()
            if self._lease is not None:
                # Nothing is consumed any more: holdings back, private queues gone.
                self._lease.stop(retire=True)
            self._notify("after_loop_exit")
            self._loop_lock.release()

    def _unexpected_error(self, error: Exception, in_hand: Delivery | None) -> None:
        """Log an error of the loop's own, count it against the message in hand, pause.

        The pause doubles with each error in a row; after FAILING_AFTER_ERRORS
        of them the loop counts as failing (on_failing) until it consumes for
        a wait period without one.
        """
        self._unexpected_errors += 1
        struck = ""
        if in_hand is not None:
            count = self._strikes.record(in_hand)
            struck = (
                f" while handling a message ({count} of {self._strikes.limit} before"
                " it is dead-lettered)"
            )
        LOG.exception(
            "Unexpected error in the consume loop of topic %r%s; restarting it", self._name, struck
        )
        if self._unexpected_errors >= FAILING_AFTER_ERRORS and self.failing is None:
            self.failing = f"{type(error).__name__}: {error}"
            LOG.error(
                "The consume loop of topic %r keeps failing (%d errors in a row, the last: %s)",
                self._name,
                self._unexpected_errors,
                self.failing,
            )
            self._notify("after_failing_change", self.failing)
        pause = min(
            RECONNECT_BACKOFF_MAX_S, UNEXPECTED_ERROR_BACKOFF_S * 2 ** (self._unexpected_errors - 1)
        )
        self._stopping.wait(pause)

    def _working(self) -> None:
        """The loop consumed for a wait period without an error of its own."""
        self._unexpected_errors = 0
        if self.failing is not None:
            LOG.warning(
                "The consume loop of topic %r works again (it failed with %s)",
                self._name,
                self.failing,
            )
            self.failing = None
            self._notify("after_failing_change", None)

    def _back_off(self, error: BaseException, failures: int) -> None:
        """Say what keeps the broker away, once per back-off step, and wait it out.

        A wrong login or an exchange declared otherwise (PRECONDITION_FAILED)
        will not cure itself, but a worker keeps trying, slowly, while an
        operator fixes it; an engine gives up at once (wait_started).
        """
        problem = self._report_problem(error)
        pause = min(RECONNECT_BACKOFF_MAX_S, RECONNECT_BACKOFF_S * 2**failures)
        lost = self._has_consumed and isinstance(problem, exc.BrokerUnavailable)
        if lost and failures == 0 and self._failover.size > 1:
            # The node we consumed from went away: the other nodes of the
            # failover list are tried at once (one pass), not after a pause.
            pause = 0.0
        if lost:
            LOG.error(
                "Consumer connection of topic %r to %s lost (%s); reconnecting in %.0f s",
                self._name,
                self._node_uri,
                error,
                pause,
            )
        else:
            quiet = self._options.quiet_until_started and not self._has_consumed
            LOG.log(
                logging.DEBUG if quiet else logging.ERROR,
                "%s; topic %r tries again in %.0f s",
                problem,
                self._name,
                pause,
            )
        self._stopping.wait(pause)

    def stop(self) -> None:
        """Ask the loop to end (it returns from start() within ``wait_period_s``)."""
        self._stopping.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the loop is consuming; False if ``timeout`` passed first."""
        return self._running.wait(timeout)

    def wait_started(
        self, timeout: float, unreachable_give_up_s: float
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
                        f"could not start consuming from {self._uri} within {timeout:.0f} s"
                    )
                wake_at = (
                    deadline
                    if unreachable_since is None
                    else min(deadline, unreachable_since + unreachable_give_up_s)
                )
                self._started_or_failed.wait(max(0.0, wake_at - now))
        return None

    def keep_alive(self) -> None:
        """Send an AMQP heartbeat frame if one is due; for a handler that waits long.

        A no-op off the consume loop's thread (only it may use the
        connection) and without heartbeats. A broken socket is only logged
        here: the loop sees it once the handler returns, and reconnects.
        """
        current = self._keepalive
        if current is None or current[0] != threading.get_ident():
            return
        try:
            current[1].beat()
        except Exception as e:
            LOG.debug("Consumer %s: heartbeat frame not sent: %s", self._name, e)

    def _report_problem(self, error: BaseException) -> exc.FlowEngineError:
        """Classify ``error`` and wake wait_started(); the classified error."""
        problem = errors.classify(
            error, self._uri, self._exchange.name, self._broker.durable, self._broker.queue_type
        )
        with self._started_or_failed:
            self._problem = problem
            self._started_or_failed.notify_all()
        return problem

    # --- one connection's worth of consuming ---

    def _consume_until_stopped(self) -> None:
        """Connect, declare, consume and drain until stop() (raises on failures)."""
        consumers: list[KombuConsumer] = []
        self._own_queues_dropped = False
        # One attempt (each URL of a failover list once): the loop's own
        # pause (stop() ends it) comes next.
        conn = self._failover.connect()
        self._node_uri = transports.public_uri(conn.as_uri())
        try:
            self._dead_letters.use(conn)
            if self._lease is None:
                # kombu's own Redis transport (chosen by a dotted path): put
                # back what a Redis restart left parked between delivery and
                # acknowledgement. flowengine's puts back its own holdings.
                run_id = recovery.broker_run_id(conn)
                if self._lost_at is not None:
                    recovery.restore_stranded(conn, self._broker_run_id)
                self._broker_run_id = run_id
            consumers = self._start_consumers(conn)
            try:
                self._started()
                self._drain(conn)
            finally:
                self._running.clear()
                # On a real AMQP broker, closing the connection (next) cancels
                # its consumers and deletes their auto-delete queues: a stop
                # need not wait for a basic.cancel answer per consumer first.
                broker_deletes = topology.deletes_auto_delete_queues(conn)
                if not (self._stopping.is_set() and broker_deletes):
                    for consumer in consumers:
                        try:
                            consumer.cancel()
                        except Exception:
                            LOG.debug("Error cancelling consumer", exc_info=True)
                elif self._outliving_queues:
                    self._delete_outliving_queues(consumers)
                if (
                    self._stopping.is_set()
                    and not broker_deletes
                    and self._lease is None
                    and not self._caps.private_queues
                ):
                    self._drop_own_queues(consumers)
        finally:
            try:
                conn.release()
            except Exception:
                LOG.debug("Error closing consumer connection", exc_info=True)
            else:
                if (
                    consumers
                    and self._stopping.is_set()
                    and self._lease is None
                    and self._caps.private_queues
                ):
                    # The filesystem transport deletes a channel's private
                    # queues as it closes it; it says which it could not.
                    self._own_queues_dropped = not any(
                        getattr(consumer.channel, "private_kept", True) for consumer in consumers
                    )

    def _delete_outliving_queues(self, consumers: Sequence[KombuConsumer]) -> None:
        """On stop(), delete the queues that would outlive this connection (RabbitMQ).

        Without an answer to wait for: the connection's close, next, comes
        after the deletes on the wire. Nobody is to read them any more, and
        left alone they would take announcements until they expire.
        """
        dropped = True
        for consumer in consumers:
            for queue in consumer.queues or ():
                if queue.name not in self._outliving_queues:
                    continue
                try:
                    queue.delete(nowait=True)
                except Exception:
                    dropped = False
                    LOG.debug("Could not delete queue %s", queue.name, exc_info=True)
        self._own_queues_dropped = dropped

    def _drop_own_queues(self, consumers: Sequence[KombuConsumer]) -> None:
        """Delete and empty this loop's private auto-delete queues, on its own channels.

        kombu's virtual transports ignore auto-delete: left bound, such a
        queue collects messages for ever. The channels that declared them
        know their bindings, so no other connection has to declare them
        again to learn which to remove (as inventory.drop_queue does).
        """
        dropped = bool(consumers)
        for consumer in consumers:
            for queue in consumer.queues or ():
                if queue.name not in self._own_queues:
                    continue
                try:
                    queue.delete()
                    queue.purge()
                except Exception:
                    dropped = False
                    LOG.debug("Could not remove queue %s", queue.name, exc_info=True)
        self._own_queues_dropped = dropped

    def _started(self) -> None:
        """Consuming (again): wake wait_started(), log a recovery, tell the observers."""
        with self._started_or_failed:
            self._running.set()
            self._problem = None
            self._consumed_since_failure = True
            self._has_consumed = True
            self._started_or_failed.notify_all()
        names_ = [q.name for q in self._queues]
        LOG.debug("Consuming %s from %s", names_, self._node_uri)
        if self._lost_at is not None:
            self.last_outage_s = time.monotonic() - self._lost_at
            self.reconnect_count += 1
            self._lost_at = None
            LOG.warning(
                "Consuming %s from %s again after %.1f s without a broker connection",
                names_,
                self._node_uri,
                self.last_outage_s,
            )
        self._notify("after_consume_start")

    def _drain(self, conn: Connection) -> None:
        """Deliver messages as they come, do the periodic work, until stop().

        A round: one wait for messages (or for room) and what it delivered.
        """
        heartbeats = conn.supports_heartbeats and bool(conn.heartbeat)
        period = self._options.wait_period_s
        room = self._wait_for_room
        keepalive = Keepalive(conn)
        # While full, wait for room in slices short enough for the heartbeats.
        room_slice = min(period, keepalive.period_s or period)
        last_wait = next_heartbeat_check = time.monotonic()
        # This thread may use the connection (see keep_alive()).
        self._keepalive = (threading.get_ident(), keepalive)
        while not self._stopping.is_set():
            if room is not None and not room(0.0):
                # Full: take nothing (drain_events would deliver), keep the
                # connection alive meanwhile.
                if not room(room_slice):
                    self._check_connection(conn)
                    keepalive.beat()
            else:
                try:
                    conn.drain_events(timeout=period)
                except TimeoutError:
                    pass
                self._check_connection(conn)
                if heartbeats and time.monotonic() >= next_heartbeat_check:
                    # py-amqp sends and checks heartbeats only when asked; a dead
                    # broker raises here (the loop reconnects).
                    next_heartbeat_check = time.monotonic() + check_period(conn)
                    conn.heartbeat_check()
            self._notify("after_round")
            now = time.monotonic()
            if now - last_wait >= period:
                last_wait = now
                if self._unexpected_errors:
                    self._working()
                self._notify("every_wait_period")

    def _check_connection(self, conn: Connection) -> None:
        """Raise (the loop reconnects) when the lease lapsed or the connection broke."""
        if self._lease is not None and self._lease.lapsed():
            # Others put back what we held and deleted our private queue:
            # declare and consume everything again.
            raise ConnectionResetError("this consumer's lease lapsed")
        if not conn.connected:
            # E.g. an ack failed on a dead broker inside a handler. Checked
            # before anything touches conn.connection: kombu would silently
            # open a *new* connection there, one without our consumer, and
            # we would wait on it for ever.
            raise ConnectionResetError("the consumer's broker connection broke")

    def _start_consumers(self, conn: Connection) -> list[KombuConsumer]:
        """Declare and consume the queues: on one channel, or one channel each."""
        amqp = topology.deletes_auto_delete_queues(conn)
        queues = [
            topology.make_queue(
                spec.name,
                self._exchange,
                spec.routing_keys,
                auto_delete=spec.auto_delete,
                durable=self._broker.durable,
                queue_type=self._broker.queue_type,
                outlives_connection=spec.outlives_connection and amqp,
            )
            for spec in self._queues
        ]
        groups = [[q] for q in queues] if self._caps.queue_per_channel else [queues]
        private = {spec.name for spec in self._queues if spec.private}
        batched = {spec.name for spec in self._queues if spec.private and spec.batched}
        unacked = (
            {spec.name for spec in self._queues if spec.auto_delete} & batched
            if amqp and not self._broker.durable
            else set()
        )
        consumers = []
        for i, group in enumerate(groups):
            channel = conn.channel()
            # Messages kombu cannot read reach on_decode_error, never raise.
            guarded.guard(channel)
            # Declarations wait for no answer: basic_consume's answer vouches
            # for them (see declare_without_waiting). Two round trips to
            # RabbitMQ instead of eight for an engine's reply queue.
            if i == 0:
                self._exchange.declare(channel=channel, nowait=True)
            if self._caps.private_queues:
                for queue in group:
                    if queue.name in private:
                        channel.mark_private(queue.name)
            if self._caps.batch_take:
                for queue in group:
                    if queue.name in batched:
                        channel.take_in_batches(queue.name)
            no_ack = all(queue.name in unacked for queue in group)
            on_message = self._on_unacked_message if no_ack else self._on_message
            consumer = KombuConsumer(
                channel,
                queues=group,
                on_message=on_message,
                on_decode_error=functools.partial(self._on_unreadable_message, no_ack=no_ack),
                accept=["json"],
                no_ack=no_ack,
                prefetch_count=None if no_ack else self._options.prefetch_count,
                auto_declare=False,
            )
            for queue in consumer.queues or ():
                topology.declare_without_waiting(queue)
            consumer.consume()
            consumers.append(consumer)
        return consumers

    def _notify(self, hook: str, *args: Any) -> None:
        """Call ``hook`` of every observer, in order; their errors are logged, never fatal."""
        for observer in self._observing[hook]:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                LOG.exception("%s of %r (topic %r) failed", hook, observer, self._name)

    # kombu calls these three from inside any read of the connection, a
    # handler's own included: each message waits for the one before (in_turn).

    def _on_unacked_message(self, message: Any) -> None:
        """Receive a message its broker needs no acknowledgement of (see QueueSpec)."""
        self._in_turn.run(self._take_unacked, message)

    def _on_message(self, message: Any) -> None:
        """Receive one raw message."""
        self._in_turn.run(self._take, message)

    def _on_unreadable_message(self, message: Any, error: BaseException, *, no_ack: bool) -> None:
        """Receive a message kombu could not read (see :mod:`.guarded`): refuse it."""
        self._in_turn.run(self._take_unreadable, message, error, no_ack)

    def _take_unacked(self, message: Any) -> None:
        delivery = Delivery(message)
        delivery.settled_by_transport()
        self._handle(delivery)

    def _take(self, message: Any) -> None:
        self._handle(Delivery(message))

    def _take_unreadable(self, message: Any, error: BaseException, no_ack: bool) -> None:
        delivery = Delivery(message)
        if no_ack:
            delivery.settled_by_transport()
        self._in_hand = delivery
        reason = (
            str(error)
            if isinstance(error, exc.MessageRefused)
            else f"unreadable ({type(error).__name__}: {error})"
        )
        if self._broker.keyring is None:
            self._dispatcher.reject(delivery, reason)  # a FAILURE where it says where
        else:
            self._dispatcher.refuse_unread(delivery, reason)  # unsigned as far as we know
        self._settle(delivery)
        self._in_hand = None

    def _handle(self, delivery: Delivery) -> None:
        """Size check, verify, decode, dispatch, settle.

        Raises only what settling raised (a broken connection: the message
        comes again once the loop reconnected).
        """
        self._in_hand = delivery
        struck = self._strikes.struck_out(delivery)
        if struck:
            delivery.refuse(f"it was in hand {struck} times when the consume loop failed")
        else:
            try:
                self._receive(delivery)
            except Exception:
                LOG.exception("Unexpected error handling a message on topic %r", self._name)
        self._settle(delivery)
        self._in_hand = None

    def _settle(self, delivery: Delivery) -> None:
        """Dead-letter it if refused, then acknowledge it unless already settled."""
        if delivery.refusal is not None:
            self._dead_letter(delivery)
        if not delivery.settled:
            try:
                delivery.ack()
            except exc.DeliveryNotSettled:
                LOG.debug("Could not acknowledge a handled message", exc_info=True)
        self._strikes.forget(delivery)

    def _dead_letter(self, delivery: Delivery) -> None:
        """Copy a refused message into its dead-letter queue, saying where.

        A broken connection is raised (the message, unsettled, comes again
        after the reconnection). Any other failure is raised too, unless the
        message already made the loop fail often enough: it is then dropped,
        with an error line, so that no message can keep the loop failing.
        """
        reason = delivery.refusal or ""
        try:
            queue = self._dead_letters.put(delivery, reason)
        except Exception as e:
            if (
                isinstance(e, tuple(self._conn.connection_errors))
                or is_connection_error(e, self._conn)
                or not self._strikes.struck_out(delivery)
            ):
                raise
            LOG.error(
                "Dropped %s refused on topic %r (%s): it could not be dead-lettered (%s)",
                describe(delivery),
                self._name,
                reason,
                e,
            )
            return
        LOG.info("Dead-lettered %s from topic %r to %s", describe(delivery), self._name, queue)

    def _receive(self, delivery: Delivery) -> None:
        headers = delivery.headers
        if (
            delivery.properties.get("type") == WAKE_TYPE
            and headers.get(WAKE_HEADER) == self._wake_token
        ):
            return  # our own stop() wake-up: acknowledged, nothing to do
        limit = self._max_body_bytes
        body = delivery.body
        if limit is not None and len(body) > limit:
            self._dispatcher.reject(
                delivery, f"body of {len(body)} bytes exceeds the limit of {limit} bytes"
            )
            return
        keyring = self._broker.keyring
        if keyring is not None:
            try:
                keyring.verify(
                    body.encode("utf-8") if isinstance(body, str) else body,
                    delivery.properties,
                    headers,
                )
            except exc.UnverifiedMessage as e:
                self._dispatcher.reject_unverified(delivery, str(e))
                return
        try:
            data = delivery.decode()
        except Exception as e:
            self._dispatcher.on_decode_error(delivery, e)
            return
        self._dispatcher.on_message(data, delivery)
