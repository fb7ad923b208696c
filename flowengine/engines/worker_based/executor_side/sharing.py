"""One started executor for every engine of a process that talks to the same workers.

An engine that starts an executor of its own pays, before its first task can
go out: two broker connections, the declaration of a reply queue, three
threads and a NOTIFY round trip to learn which workers are up. That is most
of a short flow's run, and a process running many flows at once (a
conductor) would hold those connections and threads once per flow.

With the engine option ``shared=True``, engines with the same broker,
exchange, topics and request options use one started
:class:`~.executor.WorkerTaskExecutor` of an :class:`ExecutorPool` instead:
the first engine's run starts it, later ones find it connected and the
workers known. Each engine reaches it through an
:class:`EngineSession`: its requests carry their engine's trace ids and
record into their engine's statistics (a :class:`~.tracking.Owner`), and
when an engine stops only its own unfinished requests are cancelled and
failed. The executor outlives the engines: it closes once no engine has
used it for :data:`IDLE_CLOSE_S`, or at interpreter exit; a forked child
starts with an empty pool.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based.executor_side import remote_stats
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.executor import WorkerTaskExecutor

__all__ = ["IDLE_CLOSE_S", "EngineSession", "ExecutorPool", "POOL", "pool_key"]

LOG = logging.getLogger(__name__)

#: Seconds a shared executor no engine uses stays connected, ready for the
#: next run, before it closes (its threads end, its reply queue goes).
IDLE_CLOSE_S = 30.0


def _plain(value: Any) -> Any:
    """A JSON-able stand-in for a key part (dataclasses field by field, mappings as dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    return repr(value)


def pool_key(**parts: Any) -> str:
    """Engines whose executor options give the same key share one executor.

    Built from every field (passwords included: engines on different
    credentials never share), never logged.
    """
    return json.dumps(parts, sort_keys=True, default=_plain)


class _Shared:
    """One pooled executor: how many engines use it, whether it started."""

    def __init__(self, executor: WorkerTaskExecutor) -> None:
        self.executor = executor
        self.users = 0
        self.start_lock = threading.Lock()
        self.started = False
        self.failed: BaseException | None = None
        self.idle_timer: threading.Timer | None = None


class ExecutorPool:
    """Started executors by :func:`pool_key`, each shared by the engines that hold it."""

    def __init__(self, idle_close_s: float = IDLE_CLOSE_S) -> None:
        self._idle_close_s = idle_close_s
        self._lock = threading.Lock()
        self._shared: dict[str, _Shared] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._shared)

    def acquire(self, key: str, make: Callable[[], WorkerTaskExecutor]) -> WorkerTaskExecutor:
        """The started executor for ``key`` (made by ``make()`` and started if none is).

        Raises what the executor's start() raised (BrokerUnavailable...) to
        every engine that waited for that start.
        """
        with self._lock:
            shared = self._shared.get(key)
            if shared is None:
                shared = self._shared[key] = _Shared(make())
            shared.users += 1
            if shared.idle_timer is not None:
                shared.idle_timer.cancel()
                shared.idle_timer = None
        try:
            with shared.start_lock:  # the first engine starts it; the others wait
                if shared.failed is not None:
                    raise shared.failed
                if not shared.started:
                    try:
                        shared.executor.start()
                    except BaseException as e:
                        shared.failed = e
                        raise
                    shared.started = True
        except BaseException:
            self.release(key, shared.executor)
            raise
        return shared.executor

    def release(self, key: str, executor: WorkerTaskExecutor) -> None:
        """An engine is done with ``executor``; the last one arms its idle close."""
        with self._lock:
            shared = self._shared.get(key)
            if shared is None or shared.executor is not executor:
                return
            shared.users -= 1
            if shared.users > 0:
                return
            if shared.failed is not None or not shared.started:
                del self._shared[key]
                return
            timer = threading.Timer(self._idle_close_s, self._close_if_idle, (key, shared))
            timer.name = "flowengine-shared-idle"
            timer.daemon = True
            shared.idle_timer = timer
        timer.start()

    def _close_if_idle(self, key: str, shared: _Shared) -> None:
        with self._lock:
            if shared.users > 0 or self._shared.get(key) is not shared:
                return
            del self._shared[key]
        LOG.debug(
            "Closing shared executor %s: unused for %.0f s",
            shared.executor.uuid,
            self._idle_close_s,
        )
        shared.executor.stop()

    def close(self) -> None:
        """Stop every executor of the pool now (engines still using one see their requests fail)."""
        with self._lock:
            pooled = list(self._shared.values())
            self._shared.clear()
        for shared in pooled:
            if shared.idle_timer is not None:
                shared.idle_timer.cancel()
            if shared.started:
                shared.executor.stop()

    def forget(self) -> None:
        """Drop every executor without stopping it: in a forked child, whose copies are dead.

        A child process inherits the pool but not its executors' threads,
        and shares their connections with its parent: its engines must start
        their own.
        """
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        self._shared = {}


#: The process's pool, used by engines with ``shared=True``.
POOL = ExecutorPool()
atexit.register(POOL.close)
os.register_at_fork(after_in_child=POOL.forget)


class EngineSession(base.TaskExecutor):
    """One engine's use of a pooled executor: its requests, trace ids and statistics.

    Stands in for a WorkerTaskExecutor in the engine: start() takes the
    pool's executor for ``key`` (made by ``make`` if there is none), stop()
    cancels and fails this engine's unfinished requests and gives it back.
    """

    def __init__(
        self,
        pool: ExecutorPool,
        key: str,
        make: Callable[[], WorkerTaskExecutor],
        root_id: str | None = None,
        parent_id: str | None = None,
    ) -> None:
        self._pool = pool
        self._key = key
        self._make = make
        #: Queue/run times and attempts of this engine's remote atoms.
        self.remote_statistics = remote_stats.RemoteStatistics()
        self._owner = tr.Owner(self.remote_statistics, root_id, parent_id)
        self._executor: WorkerTaskExecutor | None = None

    def start(self) -> None:
        """Take the pool's executor (starting it if this is the first engine)."""
        if self._executor is None:
            self._executor = self._pool.acquire(self._key, self._make)

    def stop(self) -> None:
        """Cancel and fail this engine's unfinished requests; give the executor back."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            executor.withdraw(self._owner)
        finally:
            self._pool.release(self._key, executor)

    def _started(self) -> WorkerTaskExecutor:
        if self._executor is None:
            raise RuntimeError("The engine's shared executor is used before start()")
        return self._executor

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: dict[str, Any],
        progress_callback: Callable[..., Any] | None = None,
    ) -> futures.Future[Any]:
        """Schedule the task's execution on a worker for this engine."""
        return self._started().execute_for(
            self._owner, task, task_uuid, arguments, progress_callback
        )

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: dict[str, Any],
        result: Any,
        failures: dict[str, Any],
        progress_callback: Callable[..., Any] | None = None,
    ) -> futures.Future[Any]:
        """Schedule the task's revert on a worker for this engine."""
        return self._started().revert_for(
            self._owner, task, task_uuid, arguments, result, failures, progress_callback
        )

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Wait for at least ``workers`` workers; return how many are still missing.

        Before start() this holds the pool's executor for the wait only: it
        stays up (idle) for the run that usually follows.
        """
        if self._executor is not None:
            return self._executor.wait_for_workers(workers, timeout)
        executor = self._pool.acquire(self._key, self._make)
        try:
            return executor.wait_for_workers(workers, timeout)
        finally:
            self._pool.release(self._key, executor)

    def set_trace_ids(self, root_id: str | None, parent_id: str | None) -> None:
        """Set the root/parent ids carried in this engine's request headers."""
        self._owner.root_id, self._owner.parent_id = root_id, parent_id
