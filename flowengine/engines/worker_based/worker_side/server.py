"""Server: the worker side of the protocol (answers NOTIFY, runs REQUESTs).

The consume loop only validates, routes and submits: NOTIFY is answered right
there, and each REQUEST runs on the executor, which publishes RUNNING, EVENT
(progress) and the outcome. Nothing a message contains can make the server
run anything but the endpoints it was given; bad input is rejected with a
logged reason and, when a reply address is known, a FAILURE reply.

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
  worker's memory (request_memory.py), never run again.

Taking messages in lives in request_intake.py, talking to executors
(replies, outcomes, heartbeats, announcements) in worker_replies.py; both
are mixins of Server.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.events import hooks as event_hooks
from flowengine.engines.worker_based.messaging import compat as compat_mod
from flowengine.engines.worker_based.messaging import dispatcher as dispatcher_mod
from flowengine.engines.worker_based.messaging import proxy as proxy_mod
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.worker_side import context as context_mod
from flowengine.engines.worker_based.worker_side import endpoint as endpoint_mod
from flowengine.engines.worker_based.worker_side import held as rm
from flowengine.engines.worker_based.worker_side import intake as request_intake
from flowengine.engines.worker_based.worker_side import replier as worker_replies
from flowengine.engines.worker_based.worker_side import runner as running_mod
from flowengine.types import failure as ft

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


def _is_redis(url: str | None, transport: str | None) -> bool:
    scheme = transport or (url.split("://", 1)[0] if url and "://" in url else "")
    return scheme in ("redis", "rediss")


def _pool_size(executor: Any) -> int | None:
    """How many threads/processes ``executor`` runs at once (None: unknown)."""
    size = getattr(executor, "_max_workers", None)
    return size if isinstance(size, int) and size > 0 else None


class Server(request_intake.IntakeMixin, worker_replies.RepliesMixin):
    """Serves task requests for one topic from one exchange, using ``executor``.

    ``heartbeat_interval`` (s) is how often each held request is repeated to
    its executor (advertised in the ``heartbeat`` header); ``capacity`` is
    how many requests may be held at once (default HELD_PER_THREAD per
    thread of ``executor``, unbounded when its size is unknown).
    """

    def __init__(self, topic: str, exchange: str, executor: Any,
                 endpoints: Iterable[endpoint_mod.Endpoint], url: str | None = None,
                 transport: str | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 retry_options: Mapping[str, Any] | None = None, *,
                 broker: BrokerSettings | None = None, worker_id: str | None = None,
                 events: bool | None = None,
                 task_runner: running_mod.TaskRunner | None = None,
                 heartbeat_interval: float = lv.HEARTBEAT_INTERVAL_S,
                 capacity: int | None = None) -> None:
        if broker is None:
            broker = BrokerSettings(url, transport, transport_options or {}, retry_options)
        elif (url, transport, transport_options, retry_options) != (None,) * 4:
            raise ValueError("give the broker as broker=BrokerSettings(...) or as url/"
                             "transport/transport_options/retry_options, not both")
        if broker.is_redis and "visibility_timeout" not in broker.transport_options:
            broker = broker.with_transport_options(visibility_timeout=REDIS_VISIBILITY_TIMEOUT_S)
        self._topic = topic
        self._exchange = exchange
        self._executor = executor
        self._endpoints = {ep.name: ep for ep in endpoints}
        self._tasks = sorted(self._endpoints)
        self._worker_id = worker_id or pr.make_worker_id()
        self._origin = pr.make_origin()
        self._interval = lv.check_interval(heartbeat_interval)
        if capacity is None:
            size = _pool_size(executor)
            capacity = None if size is None else size * HELD_PER_THREAD
        self._capacity = capacity
        self._memory = rm.RequestMemory()
        self._room = threading.Condition()
        self._stopping = threading.Event()
        self._beat_thread: threading.Thread | None = None
        self._beat_wake = threading.Event()
        self._answer_lock = threading.Lock()
        self._last_announce = time.monotonic()
        self._started_once = False
        # How bodies run: thread or forked child, time limits, shutdown gate.
        self._task_runner = task_runner or running_mod.TaskRunner()
        private_key = pr.worker_routing_key(topic, self._worker_id)
        queues = [
            # compat='taskflow': auto-deleted, as TaskFlow declares it.
            proxy_mod.QueueSpec(pr.topic_queue_name(exchange, topic), (topic,),
                                auto_delete=compat_mod.topic_queue_auto_delete(broker.compat)),
            # The broadcast key reaches every flowengine worker of the topic
            # (a NOTIFY on the topic key reaches only one of them).
            proxy_mod.QueueSpec(pr.worker_queue_name(exchange, topic, self._worker_id),
                                (private_key, lv.broadcast_routing_key(topic)),
                                auto_delete=True, private=True),
        ]
        handlers = {
            pr.NOTIFY: dispatcher_mod.Handler(
                self._process_notify,
                validator=functools.partial(pr.Notify.validate, response=False),
                required_properties=("reply_to",)),
            # A request is acknowledged once this worker answers for it (see
            # _process_request), not when it arrives.
            pr.REQUEST: dispatcher_mod.Handler(
                self._process_request, validator=pr.Request.validate,
                required_properties=("reply_to", "correlation_id"), settles=True),
        }
        self._proxy = proxy_mod.Proxy(
            topic, exchange, handlers, self._on_wait, broker=broker, queues=queues,
            wake_routing_key=private_key, on_reject=self._on_reject, on_start=self._on_start,
            consume=proxy_mod.ConsumeOptions(
                prefetch_count=PREFETCH_COUNT,
                # Redis: what this worker took goes back to its queue once the
                # worker stops renewing (as silent as a lost request), and it
                # puts back what dead consumers held.
                lease=proxy_mod.LeaseSpec(self._worker_id,
                                          lv.lost_after(self._interval, lv.HEARTBEAT_MISSES),
                                          reclaim=True)))
        self._events = event_hooks.WorkerEvents.create(exchange, self._worker_id, topic,
                                                       self._tasks, broker, enabled=events)

    # --- facts ---

    @property
    def worker_id(self) -> str:
        """Unique id of this worker (header ``worker_id`` of its messages)."""
        return self._worker_id

    @property
    def topic(self) -> str:
        """The topic served."""
        return self._topic

    @property
    def tasks(self) -> list[str]:
        """Task class names served (sorted)."""
        return list(self._tasks)

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
    def memory(self) -> rm.RequestMemory:
        """The requests held and recently finished (duplicate detection)."""
        return self._memory

    @property
    def running_count(self) -> int:
        """How many requests are held (queued here or running) right now."""
        return len(self._memory)

    # --- lifecycle ---

    def start(self) -> None:
        """Serve until stop() (blocks the calling thread)."""
        self._stopping.clear()
        if self._beat_thread is None or not self._beat_thread.is_alive():
            self._beat_thread = threading.Thread(
                target=self._beat_loop, name=f"flowengine-heartbeat-{self._topic}",
                daemon=True)
            self._beat_thread.start()
        self._proxy.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the server consumes; False if ``timeout`` passed first."""
        return self._proxy.wait(timeout)

    def stop(self) -> None:
        """Say goodbye to executors and stop consuming (held requests go on, heartbeating)."""
        self._stopping.set()
        with self._room:
            self._room.notify_all()
        if self._proxy.is_running:
            self._announce(leaving=True)
        self._proxy.stop()
        self._events.offline()

    # --- consume-loop callbacks (taking messages in: request_intake.py) ---

    def _on_start(self) -> None:
        """Consuming (again): announce ourselves at once (no waiting to be polled)."""
        if not self._started_once:
            self._started_once = True
            LOG.info("Worker %s serves topic %r with %d task(s); heartbeat every %.2f s,"
                     " holds at most %s request(s)", self._worker_id, self._topic,
                     len(self._tasks), self._interval, self._capacity or "unbounded")
        self._announce()
        self._events.online()

    def _on_wait(self) -> None:
        """Periodic work of the consume loop (heartbeats have their own thread)."""
        self._events.heartbeat()

    # --- executor side ---

    def _run(self, endpoint: endpoint_mod.Endpoint, task: Any, work: pr.WorkUnit,
             key: rm.Key, headers: Any = None) -> None:
        """Run one request on an executor thread and send its replies."""
        task_uuid = key[0]
        held = self._memory.start(key)
        if held is None:  # pragma: no cover - admitted before submit
            return
        outcome: dict[str, Any] | None = None
        try:
            if held.expires is not None and time.time() > held.expires:
                # Waited here for a thread past the time its executor gave up.
                self._answering(held)
                self._drop_expired(held.reply_to, task_uuid, work.task_name, held.expires,
                                   held.attempt, {"task_name": work.task_name}, headers or {})
                return
            if not self._reply(held.reply_to, task_uuid, pr.RUNNING, held.attempt):
                LOG.error("Request %s for task %r not run: its RUNNING reply could not"
                          " be sent", task_uuid, work.task_name)
                return
            self._events.started(task_uuid)
            started = time.monotonic()
            progress = functools.partial(self._on_event, held, task_uuid)
            ctx = context_mod.RequestContext(task_uuid, work.action, held.attempt or 0,
                                             key[2], self._worker_id)
            with context_mod.running(ctx):
                result = self._task_runner.run(endpoint, task, work, progress, headers,
                                               key[:2])
            elapsed = time.monotonic() - started
            state = pr.FAILURE if isinstance(result, ft.Failure) else pr.SUCCESS
            outcome = self._send_outcome(held, task_uuid, work, state, result)
            self._events.finished(task_uuid, state == pr.SUCCESS, result)
            if isinstance(result, ft.Failure):
                # The task's own error: the operator reads it here, the engine
                # gets it (traceback included) in the FAILURE reply.
                LOG.warning("Task %r (%s) %s for request %s failed in %.3f s: %s\n%s",
                            work.task_name, work.task_cls, work.action, task_uuid, elapsed,
                            result.exception_str, result.traceback_str or "")
            else:
                LOG.info("Task %r (%s) %s for request %s finished in %.3f s: %s",
                         work.task_name, work.task_cls, work.action, task_uuid, elapsed,
                         state)
        except Exception:
            LOG.exception("Unexpected error running request %s", task_uuid)
        finally:
            self._finished(key, outcome)
