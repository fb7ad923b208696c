"""Worker: a process (or thread) that runs the tasks it was given for a topic."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import flowengine
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import clock, names
from flowengine.engines.worker_based.worker_side import activity as activity_mod
from flowengine.engines.worker_based.worker_side import control as control_mod
from flowengine.engines.worker_based.worker_side import endpoint as endpoint_mod
from flowengine.engines.worker_based.worker_side import exception_handlers as eh
from flowengine.engines.worker_based.worker_side import priority
from flowengine.engines.worker_based.worker_side import runner as running_mod
from flowengine.engines.worker_based.worker_side import server as server_mod
from flowengine.engines.worker_based.worker_side import standard_middleware as standard
from flowengine.engines.worker_based.worker_side.middleware import Middleware
from flowengine.engines.worker_based.worker_side.server_options import ServerOptions
from flowengine.engines.worker_based.worker_side.serving import ServingThreads
from flowengine.engines.worker_based.worker_side.settings import WorkerSettings, split_options
from flowengine.engines.worker_based.worker_side.task_list import TaskItem, derive_endpoints
from flowengine.engines.worker_based.worker_side.timelimits import join_alarm_thread
from flowengine.engines.worker_based.worker_side.worker_events import EventsMiddleware
from flowengine.utils import reflection
from flowengine.utils import threading_utils as tu

LOG = logging.getLogger(__name__)

# derive_endpoints and TaskItem live in task_list; importable from here as before.
__all__ = ["STOP_JOIN_TIMEOUT_S", "TaskItem", "Worker", "derive_endpoints"]

#: Seconds run() and stop() wait for the worker's threads to end once they
#: were asked to (consume loops end within their wait period; heartbeat and
#: fence threads once nothing is held): a bound, not a pause.
STOP_JOIN_TIMEOUT_S = 10.0


class Worker:
    """A worker that can be started on a remote host to serve task requests.

    TaskFlow's arguments, as TaskFlow takes them:

    ``tasks`` items may be module names (every concrete Task subclass defined
    in the module), ``"module:Class"``/``"module.Class"`` strings, modules or
    Task classes. Only these tasks can ever run here: a request naming any
    other class gets an UnknownTask failure.

    ``topic`` is one topic, or several in priority order (``["high",
    "low"]``): one consume loop each, one pool; when several have work the
    request of the first is taken first (see :mod:`.priority`).

    ``executor`` is ``"threads"`` (default: bodies run in a pool of
    ``threads_count`` threads), ``"processes"`` (each body runs in a child
    forked for it, at most ``threads_count`` at once; a hard time limit kills
    the child) or a futures executor of your own (threads semantics).
    ``url``, ``transport``, ``transport_options`` and ``retry_options`` say
    where the broker is.

    Then flowengine's, keyword-only: ``broker`` (a
    :class:`~..messaging.settings.BrokerSettings`, instead of the four broker
    arguments: durability, signing, compat, body and redelivery limits,
    queue type, failover) and ``settings`` (a
    :class:`~.settings.WorkerSettings`: worker id, events, time limits,
    heartbeat interval, exception handlers, control, metrics, your own
    :class:`~.middleware.Middleware`, called after the built-in ones in
    the order given: see :attr:`middleware`). For older
    callers, their fields may also be given as loose keywords
    (``Worker(..., durable=True, soft_time_limit=30)``), not together with
    ``settings=`` or (for the broker's) ``broker=``.

    Raises TypeError for an unknown keyword or one given twice (loose and in
    an object); ValueError for no topic, a repeated one, a pool of unknown
    size shared by several topics, a value a settings object refuses, or
    ``broker`` together with ``url``/``transport``/``transport_options``/
    ``retry_options``.
    """

    def __init__(
        self,
        exchange: str,
        topic: str | Sequence[str],
        tasks: TaskItem | Iterable[TaskItem],
        executor: str | cf.Executor | None = None,
        threads_count: int | None = None,
        url: str | None = None,
        transport: str | None = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | None = None,
        *,
        broker: BrokerSettings | None = None,
        settings: WorkerSettings | None = None,
        **options: Any,
    ) -> None:
        settings, broker = _settings_from(
            settings, broker, options, url, transport, transport_options, retry_options
        )
        self._settings = settings
        topics = [topic] if isinstance(topic, str) else list(topic)
        if not topics or len(set(topics)) != len(topics):
            raise ValueError(f"a worker needs one or more distinct topics, got {topics!r}")
        self._topics = topics
        self._topic = topics[0]
        self._exchange = exchange
        kind = running_mod.THREADS
        if isinstance(executor, str):
            kind, executor = running_mod.executor_kind(executor), None
        self._task_runner = running_mod.TaskRunner(kind, default_limits=settings.time_limits)
        self._owns_executor = executor is None
        self._threads_count = -1
        if executor is None:
            if threads_count is None:
                threads_count = tu.get_optimal_thread_count()
            threads_count = int(threads_count)
            if threads_count <= 0:
                raise ValueError("threads_count provided must be > 0")
            self._threads_count = threads_count
            # The stdlib's pool, not futurist's, whose idle threads poll every
            # second (every shutdown would cost up to a second).
            executor = cf.ThreadPoolExecutor(
                threads_count, thread_name_prefix=f"flowengine-pool-{topics[0]}"
            )
        self._executor: cf.Executor = executor
        self._endpoints = derive_endpoints(tasks)
        self._broker = broker
        worker_id = settings.worker_id or names.make_worker_id()
        self._activity = activity_mod.Activity(
            kill_child=getattr(self._task_runner.body_runner, "cancel_thread", None)
        )
        chain = eh.HandlerChain(
            settings.exception_handlers, default=settings.default_exception_handler
        )
        # One list, walked in this order at every hook point (see middleware.py):
        # the activity counts a request before its event says it ended.
        self._middleware: list[Middleware] = [
            *standard.tracing_middleware(worker_id),
            self._activity,
            *([] if settings.metrics is None else [standard.MetricsMiddleware(settings.metrics)]),
            standard.FencingMiddleware(worker_id),
            standard.ExceptionHandlersMiddleware(worker_id, chain),
            EventsMiddleware.create(
                exchange,
                worker_id,
                topics,
                sorted(ep.name for ep in self._endpoints),
                broker,
                enabled=settings.events,
            ),
            *settings.middleware,
        ]
        room: priority.PriorityRoom | None = None
        if len(topics) > 1:
            size = server_mod.pool_size(self._executor)
            if size is None:
                raise ValueError(
                    "a worker of several topics needs a pool of known size"
                    " (threads_count, or a ThreadPoolExecutor)"
                )
            room = priority.PriorityRoom(size * server_mod.HELD_PER_THREAD, len(topics))
        self._servers = [
            server_mod.Server(
                name,
                exchange,
                self._executor,
                self._endpoints,
                broker=broker,
                options=ServerOptions(
                    worker_id=worker_id,
                    events=settings.events,
                    task_runner=self._task_runner,
                    heartbeat_interval=settings.heartbeat_interval,
                    room=room,
                    rank=rank,
                    # One Redis lease per consume loop: each puts back only its own.
                    lease_id=worker_id if rank == 0 else f"{worker_id}.{name}",
                    middleware=self._middleware,
                    # Its own pool of threads: a short request may run on the
                    # consume loop's thread instead (forked bodies never do).
                    short_bodies_here=self._owns_executor and kind == running_mod.THREADS,
                ),
            )
            for rank, name in enumerate(topics)
        ]
        self._server = self._servers[0]
        self._room = room
        self._control = (
            control_mod.ControlServer(exchange, worker_id, broker, self)
            if settings.control
            else None
        )
        self._serving: ServingThreads | None = None
        #: Called by a ``control shutdown`` request (default: :meth:`stop` in
        #: a thread); ``flowengine worker`` makes it a warm shutdown.
        self.on_shutdown_request: Callable[[], None] | None = None
        #: A helpful banner that can be shown before running.
        self.banner = self._generate_banner()

    @property
    def worker_id(self) -> str:
        """Unique id of this worker."""
        return self._server.worker_id

    @property
    def settings(self) -> WorkerSettings:
        """How this worker behaves (the options it was given, checked)."""
        return self._settings

    @property
    def broker(self) -> BrokerSettings:
        """Where the broker is and how this worker talks to it."""
        return self._broker

    @property
    def topic(self) -> str:
        """The topic served (the first, with several)."""
        return self._topic

    @property
    def topics(self) -> list[str]:
        """Every topic served, in priority order."""
        return list(self._topics)

    @property
    def endpoints(self) -> list[endpoint_mod.Endpoint]:
        """The endpoints (task classes) served."""
        return list(self._endpoints)

    @property
    def server(self) -> server_mod.Server:
        """The underlying server (of the first topic)."""
        return self._server

    @property
    def servers(self) -> list[server_mod.Server]:
        """One server per topic, in priority order."""
        return list(self._servers)

    @property
    def priority_room(self) -> priority.PriorityRoom | None:
        """Where the topics' loops wait for their turn (None with one topic)."""
        return self._room

    @property
    def control(self) -> control_mod.ControlServer | None:
        """The control server (None when control is off)."""
        return self._control

    @property
    def activity(self) -> activity_mod.Activity:
        """The requests held here and the counters ``inspect`` reports."""
        return self._activity

    @property
    def middleware(self) -> list[Middleware]:
        """Every middleware of this worker, in the order each hook point calls them."""
        return list(self._middleware)

    @property
    def task_runner(self) -> running_mod.TaskRunner:
        """How task bodies run here (executor kind, default time limits)."""
        return self._task_runner

    def shutdown_pool(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Shut down the request pool (waiting for what runs, or cancelling what waits)."""
        self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)

    def _generate_banner(self) -> str:
        """Describe the worker: connection (no password), executor, tasks, system."""
        details = self._server.connection_details
        transport = details.transport
        lines = [
            f"flowengine v{flowengine.__version__} WBE worker.",
            "Connection details:",
            f"  Driver = {transport.driver_name} v{transport.driver_version}",
            f"  Exchange = {self._exchange}",
            f"  Topic = {', '.join(self._topics)}",
            f"  Transport = {transport.driver_type}",
            f"  Uri = {details.uri}",
        ]
        if transport.options:
            lines.append(f"  Transport options = {transport.options}")
        lines.append("Powered by:")
        lines.append(f"  Executor = {reflection.get_class_name(self._executor)}")
        lines.append(f"  Task bodies run in = {self._task_runner.kind}")
        if self._task_runner.default_limits.any:
            lines.append(f"  Default time limits = {self._task_runner.default_limits}")
        if self._threads_count != -1:
            lines.append(f"  Thread count = {self._threads_count}")
        lines.append("Supported endpoints:")
        for ep in self._endpoints:
            lines.append(f"  - {ep}")
        lines.extend(
            [
                "System details:",
                f"  Hostname = {socket.gethostname()}",
                f"  Pid = {os.getpid()}",
                f"  Platform = {platform.platform()}",
                f"  Python = {sys.version.split()[0]}",
                f"  Thread id = {tu.get_ident()}",
                f"  Worker id = {self.worker_id}",
            ]
        )
        return "\n".join(lines)

    def run(
        self, display_banner: bool = True, banner_writer: Callable[[str], object] | None = None
    ) -> None:
        """Run the worker until stop() is called (blocks the calling thread).

        Each topic's consume loop runs in a thread of its own
        (``flowengine-consume-<topic>``), control requests in another; this
        thread waits for them. Raises what made a consume loop end before
        stop() was called, once the other loops were stopped.
        """
        if display_banner:
            if banner_writer is None:
                for line in self.banner.splitlines():
                    LOG.info(line)
            else:
                banner_writer(self.banner)
        serving = ServingThreads()
        loops = [(f"flowengine-consume-{server.topic}", server.start) for server in self._servers]
        if self._control is not None:
            loops.append((f"flowengine-control-{self.worker_id}", self._control.start))
        self._serving = serving
        serving.start(loops)
        try:
            error = serving.wait_first()
        except BaseException:
            # E.g. KeyboardInterrupt in the main thread: the loops end too.
            self.stop_serving()
            raise
        if error is not None:
            self.stop_serving()
        # Every loop was asked to stop: a request being handed over still
        # reaches the pool before run() returns.
        serving.join(STOP_JOIN_TIMEOUT_S)
        if error is not None:
            raise error

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every consume loop is serving; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        parts: list[Any] = [*self._servers]
        if self._control is not None:
            parts.append(self._control)
        for part in parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not part.wait(left):
                return False
        return True

    def stop_serving(self) -> None:
        """Stop taking requests and answering control (held requests go on)."""
        for server in self._servers:
            server.stop()
        if self._control is not None:
            self._control.stop()

    def stop(self) -> None:
        """Stop taking requests; finish (and answer) running ones if we own the executor.

        Returns once the worker's threads ended (each waited for
        STOP_JOIN_TIMEOUT_S at most): its consume and control loops, and,
        with a pool of its own, the pool's threads and each topic's
        heartbeat and fence threads, which end once every request held was
        answered. With an executor of yours, the requests it still runs keep
        their heartbeat and fence threads until they are answered.
        """
        self.stop_serving()
        serving = self._serving
        if serving is not None:
            # Before the pool shuts: a request being handed over reaches it.
            serving.join(STOP_JOIN_TIMEOUT_S)
        if self._owns_executor:
            # A body that stops its own worker cannot wait for itself: its
            # request's threads end after it, once it was answered.
            on_pool = threading.current_thread() in getattr(self._executor, "_threads", ()) or (
                serving is not None and serving.runs_here()
            )
            self._executor.shutdown(wait=not on_pool)
            if on_pool:
                return
            deadline = time.monotonic() + STOP_JOIN_TIMEOUT_S
            for server in self._servers:
                server.join_helpers(max(0.0, deadline - time.monotonic()))
            # The process's time-limit thread, once no body has a limit pending.
            join_alarm_thread(max(0.0, deadline - time.monotonic()))

    # --- held requests, over every topic (shutdown) ---

    def running_requests(self) -> list[tuple[tuple[str, str], str, bool]]:
        """Requests taken and not answered yet: ((uuid, action), reply_to, started)."""
        return [entry for server in self._servers for entry in server.running_requests()]

    def wait_until_sent(self, keys: set[tuple[str, str]], timeout_s: float) -> set[tuple[str, str]]:
        """Block until the outcomes of ``keys`` were sent, for ``timeout_s`` at most.

        Returns those of ``keys`` still held then (empty: all sent).
        """
        deadline = time.monotonic() + timeout_s
        for server in self._servers:
            server.wait_until_sent(keys, deadline)
        return {key for key, _, _ in self.running_requests()} & keys

    def give_back(self, key: tuple[str, str], error: BaseException) -> bool:
        """Answer held request ``key`` with FAILURE ``error`` (cold shutdown)."""
        for server in self._servers:
            if any(k == key for k, _, _ in server.running_requests()):
                return server.give_back(key, error)
        return False

    # --- what the control server asks (see control.ControlTarget) ---

    def describe(self) -> dict[str, Any]:
        """Who this worker is, JSON-ready."""
        host, _, pid = names.make_origin().rpartition(":")
        queues = [spec.name for server in self._servers for spec in server.proxy.queues]
        if self._control is not None:
            queues.append(self._control.queue_name)
        held = self._activity.snapshot()
        return {
            "worker_id": self.worker_id,
            "hostname": host,
            "pid": int(pid),
            "held": len(held),
            "running": sum(1 for r in held if r["state"] == activity_mod.RUNNING),
            "topics": list(self._topics),
            "tasks": self._server.tasks,
            "threads": server_mod.pool_size(self._executor),
            "executor": self._task_runner.kind,
            "capacity": self._server.capacity,
            "version": flowengine.__version__,
            "queues": queues,
            "started_at": self._activity.started_at,
            # Topics whose consume loop keeps failing (not announced meanwhile).
            "failing": {
                server.topic: server.proxy.failing
                for server in self._servers
                if server.proxy.failing is not None
            },
        }

    def statistics(self) -> dict[str, Any]:
        """Counters, held requests, uptime and broker connections, JSON-ready."""
        return {
            "uptime_s": round(clock.wall() - self._activity.started_at, 3),
            "totals": self._activity.totals.as_dict(),
            "by_task": {name: c.as_dict() for name, c in self._activity.by_task.items()},
            "broker": self._broker.public_uri,
            "reconnects": sum(s.proxy.reconnect_count for s in self._servers),
            "dead_lettered": sum(sum(s.proxy.dead_lettered.values()) for s in self._servers),
            "requests": self._activity.snapshot(),
        }

    def requests(self) -> list[dict[str, Any]]:
        """The requests held here, JSON-ready (oldest first)."""
        return self._activity.snapshot()

    def cancel(self, request_uuid: str) -> dict[str, Any]:
        """Cancel ``request_uuid`` here (see Activity.cancel)."""
        return self._activity.cancel(request_uuid)

    def request_shutdown(self) -> None:
        """A ``control shutdown`` arrived: warm shutdown."""
        if self.on_shutdown_request is not None:
            self.on_shutdown_request()
            return
        threading.Thread(target=self.stop, name="flowengine-control-stop", daemon=True).start()


def _settings_from(
    settings: WorkerSettings | None,
    broker: BrokerSettings | None,
    options: dict[str, Any],
    url: str | None,
    transport: str | None,
    transport_options: Mapping[str, Any] | None,
    retry_options: Mapping[str, Any] | None,
) -> tuple[WorkerSettings, BrokerSettings]:
    """The worker's settings and broker from its arguments (loose keywords folded in).

    TypeError for an unknown keyword, or one also said by ``settings``/``broker``.
    """
    worker_fields, broker_fields = split_options(options)
    if settings is not None and options:
        raise TypeError(
            f"Worker() got settings= and the loose option(s)"
            f" {', '.join(sorted(options))}: put worker options in the"
            f" WorkerSettings and broker options in broker=BrokerSettings(...)"
        )
    if broker is not None and broker_fields:
        raise TypeError(
            f"Worker() got broker= and the loose broker option(s)"
            f" {', '.join(sorted(broker_fields))}: give them in the BrokerSettings"
        )
    if settings is None:
        settings = WorkerSettings(**worker_fields)
    broker = BrokerSettings.given(
        broker, url, transport, transport_options, retry_options, **broker_fields
    )
    return settings, broker
