"""The executor side of the worker-based engine: publish requests, follow replies.

The request path never waits on a timer: a request is published as soon as a
capable worker is known (else it waits and is published the moment one is
discovered) and each reply is handled as it arrives, in whatever order. A
separate housekeeping thread does the periodic work beside that path:
expiring requests nobody started, noticing workers that died while running
one, refreshing discovery and forgetting silent workers.

WorkerTaskExecutor is assembled from one module per concern:
:mod:`.requesting` (the request path), :mod:`.replies` (reply handling) and
:mod:`.housekeeping` (deadlines, lost requests, the grace after the
executor's own broker outage); this module holds its life cycle.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import discovery as wt
from flowengine.engines.worker_based.executor_side import housekeeper as hk
from flowengine.engines.worker_based.executor_side import publisher as requesting
from flowengine.engines.worker_based.executor_side import (
    remote_stats,
    replies,
    reply_queue,
    unserved,
)
from flowengine.engines.worker_based.executor_side import tracking as tr

# Re-exported: these names were defined here before the executor was split
# into modules, and users, tests and docs import them from here.
from flowengine.engines.worker_based.executor_side.housekeeper import (  # noqa: F401
    CONSUMER_TICK_S,
    HOUSEKEEPING_MAX_SLEEP_S,
    LOST_HISTORY_MAX,
    LostRecord,
)
from flowengine.engines.worker_based.executor_side.publisher import ORIGIN as _ORIGIN  # noqa: F401
from flowengine.engines.worker_based.executor_side.publisher import STOP as _STOP
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.wire import liveness as lv

__all__ = ["CONSUMER_TICK_S", "HEARTBEAT_MISSES", "HOUSEKEEPING_MAX_SLEEP_S",
           "LIVENESS_OPTIONS", "LOST_HISTORY_MAX", "LostRecord", "MAX_ATTEMPTS",
           "REQUEST_TIMEOUT_S", "START_TIMEOUT_S", "STOP_JOIN_TIMEOUT_S",
           "UNREACHABLE_GIVE_UP_S", "WorkerTaskExecutor", "liveness_options"]

LOG = logging.getLogger(__name__)

# Seconds a request may stay WAITING (no capable worker known) or PENDING
# (published, not yet started) before it fails with RequestTimeout; TaskFlow's
# default, long enough for a worker to start and announce itself.
REQUEST_TIMEOUT_S = pr.REQUEST_TIMEOUT_S

# Heartbeats a held request may miss before it is lost with its worker, and
# how many dispatches one request gets in total (see liveness.py for why).
HEARTBEAT_MISSES = lv.HEARTBEAT_MISSES
MAX_ATTEMPTS = lv.MAX_ATTEMPTS

# Executor options (engine options of the same names) for liveness; see
# WorkerTaskExecutor and doc/source/reliability.rst.
LIVENESS_OPTIONS = ("heartbeat_interval", "heartbeat_misses", "lost_after", "max_attempts",
                    "run_timeout")


def liveness_options(options: Any) -> dict[str, Any]:
    """The liveness options present in engine ``options`` (to pass to the executor)."""
    return {name: options[name] for name in LIVENESS_OPTIONS if name in options}


# Seconds to wait for the reply consumer to be ready in start(): a broker that
# takes longer than this is reported instead of hanging the engine.
START_TIMEOUT_S = 30.0

#: Seconds an engine waits for a broker that refuses connections before it
#: fails (BrokerUnavailable): long enough for a broker restart's blip, short
#: enough that a wrong host or port is reported while the user still waits.
UNREACHABLE_GIVE_UP_S = 5.0

# Seconds stop() waits for each helper thread to finish before giving up on it
# (they are daemons, so a stuck broker call cannot keep the process alive).
STOP_JOIN_TIMEOUT_S = 10.0


class WorkerTaskExecutor(requesting.RequestPublishing, replies.ReplyHandling,
                         hk.Housekeeping, base.TaskExecutor):
    """Executes tasks on remote workers."""
    def __init__(self, uuid: str, exchange: str, topics: Iterable[str],
                 transition_timeout: float | None = REQUEST_TIMEOUT_S,
                 url: str | None = None, transport: str | None = None,
                 transport_options: dict | None = None, retry_options: dict | None = None,
                 worker_expiry: float | None = wt.WORKER_EXPIRY_S, *,
                 root_id: str | None = None, parent_id: str | None = None,
                 durable: bool = False, secret: Any = None,
                 compat: str | None = None,
                 heartbeat_interval: float = lv.HEARTBEAT_INTERVAL_S,
                 heartbeat_misses: int = HEARTBEAT_MISSES, lost_after: float | None = None,
                 max_attempts: int = MAX_ATTEMPTS,
                 run_timeout: float | None = None) -> None:
        self._uuid = uuid
        self._compat = compat  # mixed fleets with TaskFlow (H12): compat.py
        self._exchange = exchange
        self._conn_args = (url, transport, dict(transport_options or {}))
        self._transition_timeout = transition_timeout
        self._root_id = root_id
        self._parent_id = parent_id
        # Liveness: a held request is lost after its worker's advertised
        # heartbeat interval (heartbeat_interval when it advertises none) x
        # heartbeat_misses of silence, or after lost_after when given.
        self._heartbeat_interval = lv.check_interval(heartbeat_interval)
        if int(heartbeat_misses) < 1:
            raise ValueError(f"heartbeat_misses must be >= 1 (got {heartbeat_misses!r})")
        self._heartbeat_misses = int(heartbeat_misses)
        self._lost_after_s = (None if lost_after is None
                              else lv.check_interval(lost_after, "lost_after"))
        if int(max_attempts) < 1:
            raise ValueError(f"max_attempts must be >= 1 (got {max_attempts!r})")
        self._max_attempts = int(max_attempts)
        if run_timeout is not None and not run_timeout > 0:
            raise ValueError(f"run_timeout must be > 0 seconds or None (got {run_timeout!r})")
        self._run_timeout = run_timeout
        #: The latest requests found lost (oldest first).
        self.lost_history: collections.deque[LostRecord] = collections.deque(
            maxlen=LOST_HISTORY_MAX)
        # worker id -> when we last asked it privately who it is.
        self._probed: dict[str, float] = {}
        # Our reply queue also receives every worker's announcements, so a
        # worker that starts after us is known the moment it is up.
        # Private: only this executor reads it, so it goes when we do — on a
        # clean stop at once, after kill -9 when our lease lapses (Redis,
        # filesystem; AMQP deletes an auto-delete queue with its consumer).
        reply_queue_spec = px.QueueSpec(pr.reply_queue_name(exchange, uuid),
                                        (uuid, pr.ANNOUNCE_ROUTING_KEY), auto_delete=True,
                                        private=True)
        self._proxy = px.Proxy(uuid, exchange, type_handlers=self._reply_handlers(), url=url,
                               transport=transport, transport_options=transport_options,
                               retry_options=retry_options,
                               queues=[reply_queue_spec], wake_routing_key=uuid,
                               # durable topology / message signing (H10c)
                               durable=durable, secret=secret, compat=compat,
                               on_wait=self._on_consumer_tick,
                               on_wait_period_s=CONSUMER_TICK_S,
                               on_start=self._on_consumer_start,
                               quiet_until_started=True)  # start() raises the problem
        # Monotonic time the reply consumer last went round its loop.
        self._consumer_tick = time.monotonic()
        # Consumer reconnections already answered with a grace (housekeeping.py).
        self._reconnects_seen = self._proxy.reconnect_count
        beat = wt.NOTIFY_PERIOD_S
        if worker_expiry is not None and worker_expiry > 0:
            # Three beats per expiry period: a worker must miss three NOTIFY
            # requests in a row before it is forgotten.
            beat = min(beat, worker_expiry / 3.0)
        self._finder = wt.ProxyWorkerFinder(uuid, self._proxy, topics,
                                            beat_periodicity=beat,
                                            worker_expiry=worker_expiry,
                                            on_change=self._on_workers_changed)
        self._book = tr.RequestBook(self._finder, transition_timeout)
        self._unserved = unserved.UnservedWatch(exchange, self._finder)
        # Uuids of tasks whose execute request expired before any worker was
        # known: nothing ran, so their revert is answered here (revert_task).
        self._never_dispatched: set[str] = set()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._releases: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        #: Queue/run times and attempts of each remote atom (engine statistics).
        self.remote_statistics = remote_stats.RemoteStatistics()

    # -- public API ---------------------------------------------------------

    @property
    def uuid(self) -> str:
        """The executor's id: its reply queue's routing key."""
        return self._uuid

    @property
    def finder(self) -> wt.ProxyWorkerFinder:
        """The worker finder (discovery state) this executor routes with."""
        return self._finder

    def execute_task(self, task: Any, task_uuid: str, arguments: dict,
                     progress_callback: Callable | None = None) -> futures.Future:
        """Schedule the task's execution on a worker; the future never raises."""
        return self._submit_task(task, task_uuid, pr.EXECUTE, arguments, progress_callback)

    def revert_task(self, task: Any, task_uuid: str, arguments: dict, result: Any,
                    failures: dict, progress_callback: Callable | None = None
                    ) -> futures.Future:
        """Schedule the task's revert on a worker (result/failures sent as dicts).

        A task whose execute request expired before any worker could take it
        never ran: there is nothing to undo, and no worker to wait another
        transition timeout for, so its revert completes at once.
        """
        if task_uuid in self._never_dispatched:
            self._never_dispatched.discard(task_uuid)
            done: futures.Future = futures.Future()
            done.set_result((base.REVERTED, None))
            return done
        return self._submit_task(task, task_uuid, pr.REVERT, arguments, progress_callback,
                                 result=result, failures=failures)

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Wait for at least ``workers`` workers; return how many are still missing."""
        return self._finder.wait_for_workers(workers=workers, timeout=timeout)

    def set_trace_ids(self, root_id: str | None, parent_id: str | None) -> None:
        """Set the root/parent ids carried in request headers (for tracing)."""
        self._root_id = root_id
        self._parent_id = parent_id

    def start(self) -> None:
        """Start consuming replies and announcements, then ask every topic who is there.

        Raises BrokerConfigError at once when waiting cannot help (wrong URL,
        login or exchange settings), BrokerUnavailable when the broker stayed
        unreachable for UNREACHABLE_GIVE_UP_S (or START_TIMEOUT_S passed).
        """
        if self._threads:
            return
        self._stopping.clear()
        self._wake.clear()
        self._spawn(self._consume, "replies")
        problem = self._proxy.wait_started(START_TIMEOUT_S, UNREACHABLE_GIVE_UP_S)
        if problem is not None:
            self.stop()
            raise problem
        self._spawn(self._release_loop, "release")
        self._spawn(self._housekeeping_loop, "housekeeping")
        try:
            self._finder.publish()
        except Exception:
            LOG.warning("Failed to send NOTIFY to topics %s; will retry in the next beat",
                        self._finder.topics, exc_info=True)

    def stop(self) -> None:
        """Stop the helper threads and the consumer; fail requests still in flight."""
        self._stopping.set()
        self._wake.set()
        self._releases.put(_STOP)
        try:
            self._proxy.stop()
        except Exception:
            LOG.warning("Failed to stop the reply consumer", exc_info=True)
        started = bool(self._threads)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(STOP_JOIN_TIMEOUT_S)
        self._threads = []
        if started and self._proxy.has_consumed:  # else no reply queue was declared
            self._drop_reply_queue()
        while True:  # whatever the release thread did not consume
            try:
                self._releases.get_nowait()
            except queue.Empty:
                break
        leftovers = self._book.drain()
        if leftovers:
            LOG.warning("Executor %s stopped with %d requests unfinished; they fail",
                        self._uuid, len(leftovers))
        for tracked in leftovers:
            self._fail(tracked, exc.ExecutionFailure(
                f"Executor {self._uuid} stopped before request {tracked.request} finished"),
                log=False)


    def _drop_reply_queue(self) -> None:
        """Unbind and empty our reply queue once nobody consumes it (see reply_queue.py)."""
        url, transport, options = self._conn_args
        reply_queue.drop_reply_queue(self._exchange, self._uuid, url, transport, options,
                                     durable=self._proxy.durable, compat=self._compat)

    # -- helper threads -----------------------------------------------------

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"wbe-{name}-{self._uuid}",
                                  daemon=True)
        thread.start()
        self._threads.append(thread)

    def _consume(self) -> None:
        """Run the proxy's message loop (it supervises its own handlers)."""
        try:
            self._proxy.start()
        except Exception:
            LOG.exception("Reply consumer of executor %s died; requests in flight will"
                          " time out or be failed on stop()", self._uuid)
