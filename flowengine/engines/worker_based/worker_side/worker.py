"""Worker: a process (or thread) that runs the tasks it was given for a topic."""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import inspect
import logging
import os
import platform
import socket
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

import flowengine
from flowengine import task as task_mod
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import timelimits as tl
from flowengine.engines.worker_based.worker_side import endpoint as endpoint_mod
from flowengine.engines.worker_based.worker_side import runner as running_mod
from flowengine.engines.worker_based.worker_side import server as server_mod
from flowengine.utils import reflection
from flowengine.utils import threading_utils as tu

LOG = logging.getLogger(__name__)

#: One item of a worker's task list: a module name, a ``'module:Class'`` or
#: ``'module.Class'`` string, a module, or a Task class.
TaskItem = str | types.ModuleType | type[task_mod.BaseTask]


def _is_task_class(obj: object) -> TypeGuard[type[task_mod.BaseTask]]:
    return inspect.isclass(obj) and issubclass(obj, task_mod.BaseTask)


def _module_tasks(module: types.ModuleType) -> list[type[task_mod.BaseTask]]:
    """Concrete task classes *defined* in ``module`` (not ones it merely imports)."""
    found = []
    for _name, obj in inspect.getmembers(module, _is_task_class):
        if obj.__module__ == module.__name__ and not inspect.isabstract(obj):
            found.append(obj)
    return found


def _checked_class(obj: object, item: object) -> type[task_mod.BaseTask]:
    """``obj`` if it is a concrete task class, else TypeError naming ``item``."""
    if not _is_task_class(obj):
        raise TypeError(f"Item {item!r} is not a Task subclass (got {obj!r})")
    if inspect.isabstract(obj):
        raise TypeError(f"Item {item!r} is an abstract task class; it cannot be run")
    return obj


def _import_item(item: str) -> list[type[task_mod.BaseTask]]:
    """Tasks named by a string: 'module', 'module:Class' or 'module.Class'."""
    if ":" in item:
        return [_checked_class(reflection.import_class(item), item)]
    try:
        module = importlib.import_module(item)
    except ModuleNotFoundError as e:
        # Only "this very name is not a module" means try it as module.Class;
        # a module that exists but fails to import is a real error.
        if e.name is None or not item.startswith(e.name):
            raise
        try:
            obj = reflection.import_class(item)
        except ImportError:
            raise ImportError(f"Task item {item!r} names neither a module nor a"
                              f" 'module.Class'") from e
        return [_checked_class(obj, item)]
    return _module_tasks(module)


def derive_endpoints(tasks: TaskItem | Iterable[TaskItem]) -> list[endpoint_mod.Endpoint]:
    """Endpoints for a task list of module names, class paths, modules or classes.

    Raises TypeError for an item of another kind, or naming a class that is
    no concrete Task; ImportError for a name that cannot be imported.
    """
    # One item alone (a name, a module, a class) stands for a list of it.
    items: list[object] = ([tasks] if isinstance(tasks, (str, bytes, type, types.ModuleType))
                           else list(tasks))
    derived: dict[type[task_mod.BaseTask], None] = {}
    for item in items:
        if isinstance(item, str):
            classes = _import_item(item)
        elif isinstance(item, types.ModuleType):
            classes = _module_tasks(item)
        elif inspect.isclass(item):
            classes = [_checked_class(item, item)]
        else:
            raise TypeError(f"Item {item!r} has unexpected type {type(item).__name__};"
                            f" expected a module name, a 'module:Class' string, a module"
                            f" or a Task class")
        for cls in classes:
            derived.setdefault(cls, None)
    return [endpoint_mod.Endpoint(cls) for cls in derived]


class Worker:
    """A worker that can be started on a remote host to serve task requests.

    ``tasks`` items may be module names (every concrete Task subclass defined
    in the module), ``"module:Class"``/``"module.Class"`` strings, modules or
    Task classes. Only these tasks can ever run here: a request naming any
    other class gets an UnknownTask failure. ``events=True`` publishes worker
    and task events on ``<exchange>.events`` (see :mod:`.events`).

    ``executor`` is ``"threads"`` (default: bodies run in a pool of
    ``threads_count`` threads), ``"processes"`` (each body runs in a child
    forked for it, at most ``threads_count`` at once; a hard time limit kills
    the child) or a futures executor of your own (threads semantics).
    ``soft_time_limit``/``time_limit`` (seconds) apply to tasks whose request
    and class set none (see :mod:`.timelimits`). ``heartbeat_interval``
    (seconds, default 2) is how often each held request is heartbeated; its
    executors declare a request lost after a few missed heartbeats (see
    doc/source/reliability.rst). ``compat='taskflow'`` declares the exchange
    and topic queue as TaskFlow does, for a fleet shared with TaskFlow (see
    doc/source/migration.rst).
    """

    def __init__(self, exchange: str, topic: str, tasks: TaskItem | Iterable[TaskItem],
                 executor: str | cf.Executor | None = None, threads_count: int | None = None,
                 url: str | None = None, transport: str | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 retry_options: Mapping[str, Any] | None = None,
                 worker_id: str | None = None, events: bool | None = None, *,
                 durable: bool = False, secret: Any = None,
                 soft_time_limit: float | None = None,
                 time_limit: float | None = None,
                 heartbeat_interval: float | None = None,
                 compat: str | None = None) -> None:
        self._topic = topic
        self._exchange = exchange
        kind = running_mod.THREADS
        if isinstance(executor, str):
            kind, executor = running_mod.executor_kind(executor), None
        self._task_runner = running_mod.TaskRunner(
            kind, default_limits=tl.make(soft_time_limit, time_limit))
        self._owns_executor = executor is None
        self._threads_count = -1
        if executor is None:
            if threads_count is None:
                threads_count = tu.get_optimal_thread_count()
            threads_count = int(threads_count)
            if threads_count <= 0:
                raise ValueError("threads_count provided must be > 0")
            self._threads_count = threads_count
            # The stdlib pool: futurist's idle threads poll every second, which
            # makes every shutdown cost up to a second.
            executor = cf.ThreadPoolExecutor(
                max_workers=threads_count, thread_name_prefix=f"flowengine-worker-{topic}")
        self._executor: cf.Executor = executor
        self._endpoints = derive_endpoints(tasks)
        broker = BrokerSettings(url, transport, transport_options or {}, retry_options,
                                durable=durable, secret=secret, compat=compat)
        self._server = server_mod.Server(
            topic, exchange, self._executor, self._endpoints, broker=broker,
            worker_id=worker_id, events=events, task_runner=self._task_runner,
            heartbeat_interval=(lv.HEARTBEAT_INTERVAL_S if heartbeat_interval is None
                                else heartbeat_interval))
        #: A helpful banner that can be shown before running.
        self.banner = self._generate_banner()

    @property
    def worker_id(self) -> str:
        """Unique id of this worker."""
        return self._server.worker_id

    @property
    def topic(self) -> str:
        """The topic served."""
        return self._topic

    @property
    def endpoints(self) -> list[endpoint_mod.Endpoint]:
        """The endpoints (task classes) served."""
        return list(self._endpoints)

    @property
    def server(self) -> server_mod.Server:
        """The underlying server."""
        return self._server

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
        lines = [f"flowengine v{flowengine.__version__} WBE worker.",
                 "Connection details:",
                 f"  Driver = {transport.driver_name} v{transport.driver_version}",
                 f"  Exchange = {self._exchange}",
                 f"  Topic = {self._topic}",
                 f"  Transport = {transport.driver_type}",
                 f"  Uri = {details.uri}"]
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
        lines.extend(["System details:",
                      f"  Hostname = {socket.gethostname()}",
                      f"  Pid = {os.getpid()}",
                      f"  Platform = {platform.platform()}",
                      f"  Python = {sys.version.split()[0]}",
                      f"  Thread id = {tu.get_ident()}",
                      f"  Worker id = {self.worker_id}"])
        return "\n".join(lines)

    def run(self, display_banner: bool = True,
            banner_writer: Callable[[str], object] | None = None) -> None:
        """Run the worker until stop() is called (blocks the calling thread)."""
        if display_banner:
            if banner_writer is None:
                for line in self.banner.splitlines():
                    LOG.info(line)
            else:
                banner_writer(self.banner)
        self._server.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the worker is serving; False if ``timeout`` passed first."""
        return self._server.wait(timeout)

    def stop(self) -> None:
        """Stop taking requests; finish (and answer) running ones if we own the executor."""
        self._server.stop()
        if self._owns_executor:
            self._executor.shutdown()
