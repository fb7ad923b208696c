"""Server: the worker side of the protocol (answers NOTIFY, runs REQUESTs).

The consume loop only validates, routes and takes: NOTIFY is answered right
there, and each REQUEST runs on the worker's pool, which publishes RUNNING,
EVENT (progress) and the outcome (or, for a short request taken while
nothing else is held, on the loop's own thread: see :mod:`.short_bodies`).
Nothing a message contains can make the server run anything but the
endpoints it was given; bad input is rejected with a logged reason and,
when a reply address is known, a FAILURE reply.

Reliability (see doc/source/reliability.rst):

* a request message is acknowledged when it is received, together with a
  PENDING reply (with this worker's id) to a flowengine executor -- in one
  atomic step on Redis -- and from then on this worker answers for it: a
  heartbeat thread of its own repeats PENDING/RUNNING for every request held
  until its outcome is sent. A request whose acknowledgement fails is not
  run here: the broker still has it (or gave it to another worker);
* the consume loop takes no new message while more than ``capacity``
  requests are held (bounded prefetch: no worker hoards a queue);
* a request past its ``expires`` is dropped unrun, on receipt or when a
  thread would start it, with a FAILURE (RequestExpired) reply;
* a duplicate of a request held or recently finished is answered from the
  worker's memory (:mod:`.held`), never run again.

:class:`Server` composes the parts, as dramatiq's Worker composes its
consumer and worker threads:

* an :class:`~.intake.Intake` (the consume loop's handlers: checks,
  duplicates, acknowledgement, hand-over, waiting for room),
* a :class:`~.performer.Performer` (each request on a pool thread),
* a :class:`~.replier.Replier` (everything said to executors, and the
  heartbeat thread),
* the :class:`~.held.RequestMemory` they share, and the proxy they talk through,
* the worker's middleware (:mod:`.middleware`): what hears of each request
  and of the consume loop, and may act on them.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import compat as compat_mod
from flowengine.engines.worker_based.messaging import proxy as proxy_mod
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire.peer_clock import PeerClocks
from flowengine.engines.worker_based.worker_side import endpoint as endpoint_mod
from flowengine.engines.worker_based.worker_side import held as held_mod
from flowengine.engines.worker_based.worker_side import runner as running_mod
from flowengine.engines.worker_based.worker_side.fence import Fence
from flowengine.engines.worker_based.worker_side.intake import Intake
from flowengine.engines.worker_based.worker_side.middleware import Middleware, MiddlewareChain
from flowengine.engines.worker_based.worker_side.performer import Performer
from flowengine.engines.worker_based.worker_side.replier import Identity, Replier
from flowengine.engines.worker_based.worker_side.server_options import ServerOptions
from flowengine.engines.worker_based.worker_side.short_bodies import ShortBodies
from flowengine.engines.worker_based.worker_side.standard_middleware import (
    ExceptionHandlersMiddleware,
    FencingMiddleware,
)
from flowengine.engines.worker_based.worker_side.worker_events import EventsMiddleware

LOG = logging.getLogger(__name__)

#: Requests a worker holds (queued + running) per thread of its pool before
#: it stops taking more: one running and one ready to start the moment a
#: thread frees, as dramatiq does; more would strand work on a busy worker.
HELD_PER_THREAD = 2

#: Messages the broker may push to the consumer before it acknowledges them
#: (per queue): the worker acknowledges on receipt, so one is enough to keep
#: it fed, and a worker busy at capacity holds at most one unacknowledged
#: message per queue, which the broker gives to others if the worker dies.
PREFETCH_COUNT = 1

#: Redis ``visibility_timeout`` (s) workers use unless told otherwise, for
#: kombu's own Redis transport (chosen by its dotted path; flowengine's puts
#: back a dead worker's messages by lease instead): a request message is
#: unacknowledged only between its receipt and the worker's PENDING reply
#: (milliseconds), so one still unacknowledged after this long belonged to a
#: worker that died in that window; kombu's default (an hour) would outlive
#: any transition timeout. Must stay well below the engine's transition_timeout.
REDIS_VISIBILITY_TIMEOUT_S = 20.0


def default_middleware(
    exchange: str, identity: Identity, broker: BrokerSettings, events: bool | None
) -> list[Middleware]:
    """What a Server made on its own (not by a Worker) calls: fencing, failure logging, events."""
    return [
        FencingMiddleware(identity.worker_id),
        ExceptionHandlersMiddleware(identity.worker_id),
        EventsMiddleware.create(
            exchange, identity.worker_id, [identity.topic], identity.tasks, broker, enabled=events
        ),
    ]


def pool_size(executor: cf.Executor) -> int | None:
    """How many threads/processes ``executor`` runs at once (None: unknown)."""
    size = getattr(executor, "_max_workers", None)
    return size if isinstance(size, int) and size > 0 else None


class Server:
    """Serves task requests for one topic from one exchange, using ``executor``.

    TaskFlow's first arguments (``topic``, ``exchange``, ``executor``: the
    pool requests run on, ``endpoints``), then where the broker is
    (``broker``, a BrokerSettings; None: kombu's default broker) and
    ``options`` (a :class:`~.server_options.ServerOptions`: worker id,
    events, task runner, heartbeat interval, capacity, the worker's middleware list and,
    for a worker of several topics, the priority room and this topic's rank).
    TaskFlow's ``url``, ``transport``, ``transport_options`` and
    ``retry_options`` are still taken as keywords, instead of ``broker``.
    """

    def __init__(
        self,
        topic: str,
        exchange: str,
        executor: cf.Executor,
        endpoints: Iterable[endpoint_mod.Endpoint],
        *,
        broker: BrokerSettings | None = None,
        options: ServerOptions = ServerOptions(),
        **taskflow_broker: Any,
    ) -> None:
        broker = BrokerSettings.given_keywords("Server", broker, taskflow_broker)
        worker_id, events, task_runner = options.worker_id, options.events, options.task_runner
        capacity, middleware, room, rank = (
            options.capacity,
            options.middleware,
            options.room,
            options.rank,
        )
        lease_id = options.lease_id
        if broker.is_redis and "visibility_timeout" not in broker.transport_options:
            broker = broker.with_transport_options(visibility_timeout=REDIS_VISIBILITY_TIMEOUT_S)
        by_name = {ep.name: ep for ep in endpoints}
        identity = Identity(
            worker_id or pr.make_worker_id(), pr.make_origin(), topic, tuple(sorted(by_name))
        )
        self._identity = identity
        self._interval = options.heartbeat_interval
        if room is not None:
            capacity = room.capacity
        elif capacity is None:
            size = pool_size(executor)
            capacity = None if size is None else size * HELD_PER_THREAD
        self._capacity = capacity
        self._started_once = False
        private_key = pr.worker_routing_key(topic, identity.worker_id)
        queues = [
            # compat='taskflow': auto-deleted, as TaskFlow declares it.
            proxy_mod.QueueSpec(
                pr.topic_queue_name(exchange, topic),
                (topic,),
                auto_delete=compat_mod.topic_queue_auto_delete(broker.compat),
            ),
            # The broadcast key reaches every flowengine worker of the topic
            # (a NOTIFY on the topic key reaches only one of them).
            proxy_mod.QueueSpec(
                pr.worker_queue_name(exchange, topic, identity.worker_id),
                (private_key, lv.broadcast_routing_key(topic)),
                auto_delete=True,
                private=True,
            ),
        ]
        proxy_options = proxy_mod.ProxyOptions(
            queues=queues,
            wake_routing_key=private_key,
            on_reject=self._on_reject,
            observer=_ConsumeLoop(self),
            wait_for_room=self._wait_for_room,
            consume=proxy_mod.ConsumeOptions(
                prefetch_count=PREFETCH_COUNT,
                # Redis: what this worker took goes back to its queue once the
                # worker stops renewing (as silent as a lost request), and it
                # puts back what dead consumers held.
                lease=proxy_mod.LeaseSpec(
                    lease_id or identity.worker_id,
                    lv.lost_after(self._interval, lv.HEARTBEAT_MISSES),
                    reclaim=True,
                ),
            ),
        )
        self._proxy = proxy_mod.Proxy(topic, exchange, None, broker=broker, options=proxy_options)
        if middleware is None:
            middleware = default_middleware(exchange, identity, broker, events)
        self._middleware = MiddlewareChain(middleware)
        self._memory = held_mod.RequestMemory() if room is None else room.memory()
        # Each engine's clock, read off its messages: expiry never compares
        # two hosts' clocks (see wire/peer_clock.py).
        clocks = PeerClocks()
        # RabbitMQ gives an unacknowledged message back at once when its
        # consumer's connection ends: a late request run on the consume loop
        # is acknowledged after its outcome (Intake), and engines are told so.
        settle_after_run = self._proxy.template_connection.transport.driver_type == "amqp"
        self._replier = Replier(
            self._proxy,
            self._memory,
            identity,
            self._interval,
            self._middleware,
            settles_after_run=settle_after_run,
        )
        runner = task_runner or running_mod.TaskRunner()
        self._performer = Performer(
            executor,
            self._memory,
            self._replier,
            self._middleware,
            runner,
            identity.worker_id,
            clocks,
            ShortBodies() if options.short_bodies_here and room is None else None,
        )
        admit, room_wait = None, None
        if room is not None:
            # Waiting for its turn holding a message, the loop keeps its
            # connection alive (AMQP heartbeats), as when it waits for room.
            admit = functools.partial(room.admit, rank, self._memory, pause=self._proxy.keep_alive)
            room_wait = room.wait_for_space
        self._intake = Intake(
            by_name,
            self._memory,
            self._replier,
            self._performer,
            None if room is not None else capacity,
            clocks,
            admit,
            room_wait,
            settle_after_run=settle_after_run,
        )
        self._fence = Fence(
            self._memory,
            runner,
            self._interval,
            identity.worker_id,
            lambda: self._proxy.publishing_fails,
            thread_name=f"flowengine-fence-{topic}",
        )
        self._proxy.dispatcher.type_handlers.update(self._intake.handlers())

    # --- facts ---

    @property
    def worker_id(self) -> str:
        """Unique id of this worker (header ``worker_id`` of its messages)."""
        return self._identity.worker_id

    @property
    def topic(self) -> str:
        """The topic served."""
        return self._identity.topic

    @property
    def tasks(self) -> list[str]:
        """Task class names served (sorted)."""
        return list(self._identity.tasks)

    @property
    def proxy(self) -> proxy_mod.Proxy:
        """The proxy used to talk to the broker."""
        return self._proxy

    @property
    def connection_details(self) -> proxy_mod.ConnectionDetails:
        """Connection details (password masked)."""
        return self._proxy.connection_details

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between two heartbeats of each held request."""
        return self._interval

    @property
    def capacity(self) -> int | None:
        """How many requests this worker holds at most (None: unbounded)."""
        return self._capacity

    @property
    def memory(self) -> held_mod.RequestMemory:
        """The requests held and recently finished (duplicate detection)."""
        return self._memory

    @property
    def events(self) -> EventsMiddleware | None:
        """This worker's event stream (a no-op unless events are on; None: not in its list)."""
        return next((m for m in self._middleware if isinstance(m, EventsMiddleware)), None)

    @property
    def middleware(self) -> list[Middleware]:
        """The middleware this server calls, in order (the worker's list)."""
        return list(self._middleware)

    @property
    def running_count(self) -> int:
        """How many requests are held (queued here or running) right now."""
        return len(self._memory)

    # --- lifecycle ---

    def start(self) -> None:
        """Serve until stop() (blocks the calling thread)."""
        self._intake.open()
        self._replier.start()
        self._fence.start()
        self._proxy.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the server consumes; False if ``timeout`` passed first."""
        return self._proxy.wait(timeout)

    def stop(self) -> None:
        """Say goodbye to executors and stop consuming (held requests go on, heartbeating)."""
        self._replier.stop()
        self._fence.stop()
        self._intake.close()
        if self._proxy.is_running:
            self._replier.announce(leaving=True)
        self._proxy.stop()
        self._middleware.after_server_stop(self.topic)

    def join_helpers(self, timeout_s: float) -> bool:
        """Wait until the heartbeat and fence threads ended (once stopped and nothing is held).

        ``timeout_s`` at most; True if both did.
        """
        deadline = time.monotonic() + timeout_s
        self._memory.wait_until_at_most(0, threading.Event(), timeout_s)
        beat_ended = self._replier.join(max(0.0, deadline - time.monotonic()))
        return self._fence.join(max(0.0, deadline - time.monotonic())) and beat_ended

    # --- held requests (shutdown) ---

    def send_heartbeats(self) -> int:
        """Repeat PENDING/RUNNING for every held request now; how many were sent."""
        return self._replier.send_heartbeats()

    def running_requests(self) -> list[tuple[tuple[str, str], str, bool]]:
        """Requests taken and not answered yet: ((uuid, action), reply_to, started)."""
        return [
            (held.key[:2], held.reply_to, held.state != held_mod.QUEUED)
            for held in self._memory.held()
        ]

    def wait_until_sent(self, keys: set[tuple[str, str]], deadline: float) -> bool:
        """Block until none of ``keys`` is held (its outcome sent), or until ``deadline``."""
        return self._memory.wait_until_none_held(keys, deadline)

    def give_back(self, key: tuple[str, str], error: BaseException) -> bool:
        """Answer held request ``key`` with FAILURE ``error`` (cold shutdown; attempt kept)."""
        return self._replier.give_back(key, error)

    # --- consume-loop callbacks ---

    def _on_start(self) -> None:
        """Consuming (again): announce ourselves at once (no waiting to be polled)."""
        if not self._started_once:
            self._started_once = True
            LOG.info(
                "Worker %s serves topic %r with %d task(s); heartbeat every %.2f s,"
                " holds at most %s request(s)",
                self.worker_id,
                self.topic,
                len(self._identity.tasks),
                self._interval,
                self._capacity or "unbounded",
            )
        if self._proxy.failing is None:
            self._replier.announce()
        self._middleware.after_consumer_start(self.topic)

    def _on_wait(self) -> None:
        """Periodic work of the consume loop (heartbeats have their own thread)."""
        self._middleware.on_consumer_period(self.topic)

    def _on_failing(self, reason: str | None) -> None:
        """The consume loop keeps failing (stop announcing us), or works again."""
        if reason is not None:
            LOG.error(
                "Worker %s stops announcing itself on topic %r: its consume loop keeps"
                " failing (%s); engines route around it until it works again",
                self.worker_id,
                self.topic,
                reason,
            )
            self._replier.silence()
            self._replier.announce(leaving=True)
        else:
            LOG.warning(
                "Worker %s announces itself on topic %r again: its consume loop works",
                self.worker_id,
                self.topic,
            )
            self._replier.silence(False)
            self._replier.announce()
        self._middleware.after_consumer_failing(self.topic, reason)

    def _wait_for_room(self, timeout_s: float) -> bool:
        return self._intake.wait_for_room(timeout_s)

    def _on_reject(self, message: Delivery, reason: str) -> None:
        self._intake.reject(message, reason)


class _ConsumeLoop(proxy_mod.LoopObserver):
    """Hands the consume loop's life to its server (which announces, then tells the middleware)."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def after_consume_start(self) -> None:
        self._server._on_start()

    def every_wait_period(self) -> None:
        self._server._on_wait()

    def after_failing_change(self, reason: str | None) -> None:
        self._server._on_failing(reason)
