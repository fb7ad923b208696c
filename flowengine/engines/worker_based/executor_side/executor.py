"""The executor side of the worker-based engine: publish requests, follow replies.

The request path never waits on a timer: a request is published as soon as a
capable worker is known (else it waits and is published the moment one is
discovered) and each reply is handled as it arrives, in whatever order. A
separate housekeeping thread does the periodic work beside that path:
expiring requests nobody started, noticing workers that died while running
one, refreshing discovery and forgetting silent workers.

:class:`WorkerTaskExecutor` composes the parts and owns their threads:

* a :class:`.publisher.RequestPublisher` (the request path, and the sender
  thread that publishes queued requests in batches, and waiting ones once a
  worker appears),
* a :class:`.replies.ReplyHandler` (the reply consumer's handlers),
* a :class:`.housekeeper.Housekeeper` (deadlines, lost requests, discovery),
* the :class:`.discovery.ProxyWorkerFinder` and the :class:`.tracking.RequestBook`
  they share, and the proxy they talk through.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import (
    cancelling,
    discovery,
    remote_stats,
    reply_queue,
    unserved,
)
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.housekeeper import (
    CONSUMER_TICK_S,
    Housekeeper,
)
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.engines.worker_based.executor_side.publisher import RequestPublisher
from flowengine.engines.worker_based.executor_side.replies import ReplyHandler
from flowengine.engines.worker_based.messaging import compat, inventory
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import clock, names
from flowengine.engines.worker_based.wire import liveness as lv

__all__ = ["START_TIMEOUT_S", "STOP_JOIN_TIMEOUT_S", "UNREACHABLE_GIVE_UP_S", "WorkerTaskExecutor"]

LOG = logging.getLogger(__name__)

#: Seconds to wait for the reply consumer to be ready in start(): a broker that
#: takes longer than this is reported instead of hanging the engine.
START_TIMEOUT_S = 30.0

#: Seconds an engine waits for a broker that refuses connections before it
#: fails (BrokerUnavailable): long enough for a broker restart's blip, short
#: enough that a wrong host or port is reported while the user still waits.
UNREACHABLE_GIVE_UP_S = 5.0

#: Seconds stop() waits for each of its threads to finish before giving up on
#: it (they are daemons, so a stuck broker call cannot keep the process alive).
STOP_JOIN_TIMEOUT_S = 10.0


def _policy_headers(policy: RequestPolicy) -> dict[str, Any]:
    """What every request tells its worker of our policy.

    The loss bound (see worker_side/fence.py), and whether we take a late
    PENDING (names.HEADER_LATE_PENDING).
    """
    headers: dict[str, Any] = {lv.HEADER_HEARTBEAT_MISSES: policy.heartbeat_misses}
    if policy.lost_after is not None:
        headers[lv.HEADER_LOST_AFTER] = policy.lost_after
    if policy.late_pending:
        headers[names.HEADER_LATE_PENDING] = True
    return headers


class _ReplyLoop(px.LoopObserver):
    """Tells the executor each time its reply queue's loop (re)starts consuming."""

    def __init__(self, started: Callable[[], None]) -> None:
        self._started = started

    def after_consume_start(self) -> None:
        self._started()


class WorkerTaskExecutor(base.TaskExecutor):
    """Executes tasks on remote workers.

    TaskFlow's arguments (``uuid``: the reply queue's routing key,
    ``exchange``, ``topics``, ``transition_timeout``, ``url``, ``transport``,
    ``transport_options``, ``retry_options``, ``worker_expiry``) plus:
    ``broker`` (a BrokerSettings, instead of the four broker arguments, with
    durability, signing and compat), ``policy`` (a RequestPolicy: liveness
    and re-dispatch; its transition_timeout wins over the argument), and
    ``root_id``/``parent_id`` (trace ids carried by every request).
    """

    def __init__(
        self,
        uuid: str,
        exchange: str,
        topics: Iterable[str],
        transition_timeout: float | None = pr.REQUEST_TIMEOUT_S,
        url: str | None = None,
        transport: str | None = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | None = None,
        worker_expiry: float | None = discovery.WORKER_EXPIRY_S,
        *,
        broker: BrokerSettings | None = None,
        policy: RequestPolicy | None = None,
        root_id: str | None = None,
        parent_id: str | None = None,
    ) -> None:
        self._uuid = uuid
        self._exchange = exchange
        self._policy = policy = policy or RequestPolicy(transition_timeout=transition_timeout)
        # Our reply queue also receives every worker's announcements, so a
        # worker that starts after us is known the moment it is up. Private:
        # only this executor reads it, so it goes when we do -- on a clean
        # stop at once, after kill -9 when our lease lapses (Redis,
        # filesystem) or it expires (AMQP). On AMQP it outlives a broken
        # connection for a while: the replies sent while we reconnect wait
        # for us instead of going with an auto-deleted queue (and their
        # finished tasks with them, to be run again once found lost).
        broker = BrokerSettings.given(broker, url, transport, transport_options, retry_options)
        self._reply_queue_outlives = compat.reply_queue_outlives_connection(broker.compat)
        reply_queue_spec = px.QueueSpec(
            pr.reply_queue_name(exchange, uuid),
            (uuid, pr.ANNOUNCE_ROUTING_KEY),
            auto_delete=True,
            private=True,
            batched=True,
            outlives_connection=self._reply_queue_outlives,
        )
        self._proxy = px.Proxy(
            uuid,
            exchange,
            None,
            self._consumer_ticked,
            broker=broker,
            options=px.ProxyOptions(
                queues=[reply_queue_spec],
                wake_routing_key=uuid,
                observer=_ReplyLoop(self._consumer_started),
                consume=px.ConsumeOptions(
                    wait_period_s=CONSUMER_TICK_S,
                    # start() raises the problem
                    quiet_until_started=True,
                ),
            ),
        )
        beat = discovery.NOTIFY_PERIOD_S
        if worker_expiry is not None and worker_expiry > 0:
            # Three beats per expiry period: a worker must miss three NOTIFY
            # requests in a row before it is forgotten.
            beat = min(beat, worker_expiry / 3.0)
        self._finder = discovery.ProxyWorkerFinder(
            uuid,
            self._proxy,
            topics,
            beat_periodicity=beat,
            worker_expiry=worker_expiry,
            on_change=self._workers_changed,
        )
        self._book = tr.RequestBook(self._finder, policy.transition_timeout)
        #: Queue/run times and attempts of each remote atom (engine statistics).
        self.remote_statistics = remote_stats.RemoteStatistics()
        # The engine this executor serves; a shared one also serves others
        # (execute_for / revert_for / withdraw).
        self._owner = tr.Owner(self.remote_statistics, root_id, parent_id)
        self._requests = RequestPublisher(
            self._proxy,
            self._book,
            uuid,
            policy.transition_timeout,
            on_new_deadline=self._wake_housekeeper,
            policy_headers=_policy_headers(policy),
            late_pending_for=(
                self._finder.settles_after_run if policy.late_pending is None else None
            ),
        )
        self._housekeeper = Housekeeper(
            uuid,
            self._book,
            self._finder,
            policy,
            self._requests,
            unserved.UnservedWatch(exchange, self._finder),
        )
        self._replies = ReplyHandler(
            uuid,
            self._book,
            self._finder,
            policy,
            probe=self._probe,
            wake_housekeeper=self._wake_housekeeper,
            release_waiting=self._workers_changed,
        )
        self._proxy.dispatcher.type_handlers.update(self._replies.handlers())
        # The threads start() started, which stop() joins.
        self._threads: list[threading.Thread] = []

    # -- public API ---------------------------------------------------------

    @property
    def uuid(self) -> str:
        """The executor's id: its reply queue's routing key."""
        return self._uuid

    @property
    def finder(self) -> discovery.ProxyWorkerFinder:
        """The worker finder (discovery state) this executor routes with."""
        return self._finder

    @property
    def policy(self) -> RequestPolicy:
        """Deadlines and re-dispatch of this executor's requests."""
        return self._policy

    @property
    def proxy(self) -> px.Proxy:
        """The proxy requests and replies go through."""
        return self._proxy

    @property
    def book(self) -> tr.RequestBook:
        """Every unfinished request, with its deadlines."""
        return self._book

    @property
    def housekeeper(self) -> Housekeeper:
        """Deadlines, lost requests and discovery upkeep (its ``lost_history``)."""
        return self._housekeeper

    @property
    def lost_history(self) -> Any:
        """The latest requests found lost (oldest first)."""
        return self._housekeeper.lost_history

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: dict[str, Any],
        progress_callback: Callable[..., Any] | None = None,
    ) -> futures.Future[Any]:
        """Schedule the task's execution on a worker; the future never raises."""
        return self.execute_for(self._owner, task, task_uuid, arguments, progress_callback)

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: dict[str, Any],
        result: Any,
        failures: dict[str, Any],
        progress_callback: Callable[..., Any] | None = None,
    ) -> futures.Future[Any]:
        """Schedule the task's revert on a worker (result/failures sent as dicts).

        A task whose execute request expired before any worker could take it
        never ran: there is nothing to undo, and no worker to wait another
        transition timeout for, so its revert completes at once.
        """
        return self.revert_for(
            self._owner, task, task_uuid, arguments, result, failures, progress_callback
        )

    def execute_for(
        self,
        owner: tr.Owner,
        task: Any,
        task_uuid: str,
        arguments: dict[str, Any],
        progress_callback: Callable[..., Any] | None = None,
    ) -> futures.Future[Any]:
        """execute_task on behalf of ``owner`` (an engine sharing this executor)."""
        return self._requests.submit(
            owner, task, task_uuid, pr.EXECUTE, arguments, progress_callback
        )

    def revert_for(
        self,
        owner: tr.Owner,
        task: Any,
        task_uuid: str,
        arguments: dict[str, Any],
        result: Any,
        failures: dict[str, Any],
        progress_callback: Callable[..., Any] | None = None,
    ) -> futures.Future[Any]:
        """revert_task on behalf of ``owner`` (an engine sharing this executor)."""
        if self._housekeeper.never_dispatched(task_uuid):
            done: futures.Future[Any] = futures.Future()
            done.set_result((base.REVERTED, None))
            return done
        return self._requests.submit(
            owner,
            task,
            task_uuid,
            pr.REVERT,
            arguments,
            progress_callback,
            result=result,
            failures=failures,
        )

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Wait for at least ``workers`` workers; return how many are still missing."""
        return self._finder.wait_for_workers(workers=workers, timeout=timeout)

    def set_trace_ids(self, root_id: str | None, parent_id: str | None) -> None:
        """Set the root/parent ids carried in request headers (for tracing)."""
        self._owner.root_id, self._owner.parent_id = root_id, parent_id

    def start(self) -> None:
        """Start consuming replies and announcements, then ask every topic who is there.

        Raises BrokerConfigError at once when waiting cannot help (wrong URL,
        login or exchange settings), BrokerUnavailable when the broker stayed
        unreachable for UNREACHABLE_GIVE_UP_S (or START_TIMEOUT_S passed).
        """
        if self._threads:
            return
        self._housekeeper.arm()
        self._spawn(self._consume, "replies")
        self._spawn(self._connect_then_send, "sender")
        problem = self._proxy.wait_started(START_TIMEOUT_S, UNREACHABLE_GIVE_UP_S)
        if problem is not None:
            self.stop()
            raise problem
        try:
            self._finder.publish()
        except Exception:
            LOG.warning(
                "Failed to send NOTIFY to topics %s; will retry in the next beat",
                self._finder.topics,
                exc_info=True,
            )
        # After the first NOTIFY: its first beat would otherwise send one too,
        # and every worker would answer twice.
        self._spawn(self._housekeeper.run, "housekeeping")

    def stop(self) -> None:
        """Stop the helper threads and the consumer; fail requests still in flight.

        Workers holding requests still in flight are asked to cancel them
        first (best effort, see :mod:`.cancelling`).
        """
        if self._threads:
            cancelling.cancel_held(self._proxy, self._book.holders())
        self._housekeeper.stop()
        self._requests.stop()
        try:
            self._proxy.stop()
        except Exception:
            LOG.warning("Failed to stop the reply consumer", exc_info=True)
        started = bool(self._threads)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(STOP_JOIN_TIMEOUT_S)
        self._threads = []
        if (
            started
            and self._proxy.has_consumed  # else no reply queue was declared
            and inventory.needs_dropping(
                self._proxy.broker,
                self._proxy.private_queues_deleted,
                self._proxy.template_connection,
                outlives_connection=self._reply_queue_outlives,
            )
        ):
            reply_queue.drop_reply_queue(
                self._proxy.broker,
                self._exchange,
                self._uuid,
                outlives_connection=self._reply_queue_outlives,
            )
        self._requests.drain_signals()
        self._fail_leftovers(self._book.drain(), f"Executor {self._uuid}")

    def withdraw(self, owner: tr.Owner) -> None:
        """``owner``'s engine stops: its unfinished requests are cancelled and fail.

        What stop() does for every request, for one engine's only; the
        executor goes on serving the others.
        """
        cancelling.cancel_held(self._proxy, self._book.holders(owner))
        self._fail_leftovers(self._book.drain(owner), f"An engine sharing executor {self._uuid}")

    def _fail_leftovers(self, leftovers: list[tr.Tracked], who: str) -> None:
        """Fail requests left unfinished when ``who`` stopped."""
        if leftovers:
            LOG.warning("%s stopped with %d requests unfinished; they fail", who, len(leftovers))
        for tracked in leftovers:
            self._requests.fail(
                tracked,
                exc.ExecutionFailure(f"{who} stopped before request {tracked.request} finished"),
                log=False,
            )

    # -- wiring between the parts -------------------------------------------

    def _consumer_ticked(self) -> None:
        self._housekeeper.consumer_ticked()

    def _consumer_started(self) -> None:
        self._housekeeper.consumer_started(self._proxy.reconnect_count, self._proxy.last_outage_s)

    def _workers_changed(self) -> None:
        self._requests.signal_workers_changed()

    def _wake_housekeeper(self) -> None:
        self._housekeeper.wake()

    def _probe(self, topic: str, worker_id: str) -> None:
        """Ask a worker we never heard from (privately) who it is."""
        try:
            self._proxy.publish(
                pr.Notify(),
                pr.worker_routing_key(topic, worker_id),
                reply_to=self._uuid,
                headers={names.HEADER_ENQUEUED: clock.wall()},
            )
        except Exception:
            LOG.warning("Failed to send NOTIFY to worker %s", worker_id, exc_info=True)

    # -- threads ------------------------------------------------------------

    def _spawn(self, target: Callable[[], None], role: str) -> None:
        """Run ``target`` in a daemon thread named ``flowengine-<role>-<executor id>``."""
        thread = threading.Thread(
            target=self._logged, args=(target,), daemon=True, name=f"flowengine-{role}-{self._uuid}"
        )
        thread.start()
        self._threads.append(thread)

    @staticmethod
    def _logged(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException:
            LOG.exception("Thread %s ended on an error", threading.current_thread().name)

    def _connect_then_send(self) -> None:
        """Open the publishing connection, then publish queued requests until stop().

        The connection is opened while the reply consumer connects and
        declares (both are round trips to the broker), not after: NOTIFY
        and the first requests then go out at once. A broker that is away is
        reported by wait_started(), not here (one bounded attempt).
        """
        self._proxy.connect_publisher()
        self._requests.run_sender()

    def _consume(self) -> None:
        """Run the proxy's message loop (it supervises its own handlers)."""
        try:
            self._proxy.start()
        except Exception:
            LOG.exception(
                "Reply consumer of executor %s died; requests in flight will"
                " time out or be failed on stop()",
                self._uuid,
            )
