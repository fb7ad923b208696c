"""Task executors: where (and how) the engine runs each task's execute/revert.

Every ``execute_task``/``revert_task`` returns a :class:`concurrent.futures.Future`
that resolves to ``(EXECUTED | REVERTED, result_or_Failure)`` and never raises:
a task's exception is captured as a :class:`~flowengine.types.failure.Failure`.
The engine waits on these futures with :func:`concurrent.futures.wait`, so any
executor (local or remote) must hand back real ``concurrent.futures.Future``
objects (futurist's futures qualify).
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from flowengine.types import failure as ft
from flowengine.types import notifier as nt

# Outcomes a task future resolves to (first item of its result pair).
EXECUTED = "executed"
REVERTED = "reverted"

# Names of the arguments the engine gives a task's revert (TaskFlow's names).
REVERT_RESULT = "result"
REVERT_FLOW_FAILURES = "flow_failures"

# The progress event a task emits on its own notifier (TaskFlow's name).
EVENT_UPDATE_PROGRESS = "update_progress"

_T = TypeVar("_T")

#: ``callback(event_type, details)`` for a task's progress events.
ProgressCallback = Callable[[str, dict[str, Any]], None]

#: Keyword arguments an atom's execute/revert is called with.
Arguments = dict[str, Any]

#: What a task or retry future resolves to: ``(EXECUTED | REVERTED, result or Failure)``.
Outcome = tuple[str, Any]

#: The future every executor method returns (it never raises).
OutcomeFuture = cf.Future[Outcome]


def execute_task(
    task: Any, arguments: Arguments, progress_callback: ProgressCallback | None = None
) -> Outcome:
    """Run ``task.execute`` here and now; return ``(EXECUTED, result|Failure)``."""
    if progress_callback is None:
        return EXECUTED, _call_execute(task, arguments)
    # register/deregister spelled out (not nt.register_deregister): this
    # runs for every task, and a generator-based context manager costs more
    # than the registration itself.
    unmade = getattr(task, "_made_notifier", True) is None
    notifier = task._engine_notifier() if unmade else task.notifier
    notifier.register(EVENT_UPDATE_PROGRESS, progress_callback)
    try:
        return EXECUTED, _call_execute(task, arguments)
    finally:
        notifier.deregister(EVENT_UPDATE_PROGRESS, progress_callback)
        _forget_if_idle(task, notifier, unmade)


def revert_task(
    task: Any,
    arguments: Arguments,
    result: Any,
    failures: Any,
    progress_callback: ProgressCallback | None = None,
) -> Outcome:
    """Run ``task.revert`` here and now; return ``(REVERTED, result|Failure)``."""
    arguments = dict(arguments)
    arguments[REVERT_RESULT] = result
    arguments[REVERT_FLOW_FAILURES] = failures
    if progress_callback is None:
        return REVERTED, _call_revert(task, arguments)
    unmade = getattr(task, "_made_notifier", True) is None
    notifier = task._engine_notifier() if unmade else task.notifier
    try:
        with nt.register_deregister(notifier, EVENT_UPDATE_PROGRESS, callback=progress_callback):
            return REVERTED, _call_revert(task, arguments)
    finally:
        _forget_if_idle(task, notifier, unmade)


def _forget_if_idle(task: Any, notifier: nt.Notifier, made_here: bool) -> None:
    """Drop a task's notifier made just to pass on its progress once nobody listens to it.

    A task makes its notifier on first use (flowengine.task.BaseTask); kept
    after every execute, each task of a large flow would hold one for good.
    """
    if made_here:
        task._drop_notifier_if_idle(notifier)


def _call_execute(task: Any, arguments: Arguments) -> Any:
    try:
        task.pre_execute()
        try:
            return task.execute(**arguments)
        finally:
            task.post_execute()
    except Exception:
        return ft.Failure()


def _call_revert(task: Any, arguments: Arguments) -> Any:
    try:
        task.pre_revert()
        try:
            return task.revert(**arguments)
        finally:
            task.post_revert()
    except Exception:
        return ft.Failure()


# Future's state once it has a result (a module constant in CPython).
_FINISHED = "FINISHED"


class _ResolvedFuture(cf.Future[Outcome]):
    """A :class:`concurrent.futures.Future` made already resolved, and cheaply.

    A plain Future makes its own Condition (a lock, a deque) for the threads
    that may wait on it: ~1 KB and a few microseconds, once per task on the
    serial engine, which holds a whole wave of them at a time (a 100,000-task
    graph flow's peak memory was 25 MB higher). A future resolved from birth never changes or wakes
    anyone, so all of them share one condition and empty lists; everything
    else (result, callbacks, ``concurrent.futures.wait``) is Future's own.
    """

    _SHARED_CONDITION = threading.Condition()
    # Never appended to: callbacks added to a resolved future run at once.
    _NO_CALLBACKS: list[Callable[[cf.Future[Outcome]], object]] = []
    # concurrent.futures.wait() appends its waiter to every future it
    # watches (only when some of them are still pending), under each
    # future's condition (here the shared one), and removes it again before
    # it returns; nothing else reads the list of a future that never
    # changes state. So one list serves all: appends and removals pair up.
    # A list each was one more object per task that the collector carried
    # into its oldest generation while a wave of tasks ran (issue 38).
    _SHARED_WAITERS: list[Any] = []

    def __init__(self, value: Outcome) -> None:  # noqa: D107 (see class)
        # Not super().__init__(): that makes the per-instance condition.
        # These are the attributes Future's methods read (CPython 3.11-3.13).
        self._condition = self._SHARED_CONDITION
        self._state = _FINISHED
        self._result = value
        self._exception = None
        self._waiters = self._SHARED_WAITERS
        self._done_callbacks = self._NO_CALLBACKS


def completed_future(value: Outcome) -> OutcomeFuture:
    """A future that is already resolved to ``value``."""
    return _ResolvedFuture(value)


class TaskExecutor(abc.ABC):
    """Executes and reverts tasks somewhere (here, a pool, a remote worker...)."""

    @abc.abstractmethod
    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Arguments,
        progress_callback: ProgressCallback | None = None,
    ) -> OutcomeFuture:
        """Schedule ``task.execute(**arguments)``; the future never raises."""

    @abc.abstractmethod
    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Arguments,
        result: Any,
        failures: Any,
        progress_callback: ProgressCallback | None = None,
    ) -> OutcomeFuture:
        """Schedule ``task.revert(result=, flow_failures=, **arguments)``."""

    def start(self) -> None:
        """Prepare to execute tasks (called each time an engine starts running)."""

    def stop(self) -> None:
        """Release what start() acquired (called when an engine run ends)."""


class SerialTaskExecutor(TaskExecutor):
    """Runs each task in the calling thread, right when it is scheduled."""

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Arguments,
        progress_callback: ProgressCallback | None = None,
    ) -> OutcomeFuture:
        return completed_future(execute_task(task, arguments, progress_callback))

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Arguments,
        result: Any,
        failures: Any,
        progress_callback: ProgressCallback | None = None,
    ) -> OutcomeFuture:
        return completed_future(revert_task(task, arguments, result, failures, progress_callback))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


class ParallelTaskExecutor(TaskExecutor):
    """Runs tasks on a PEP 3148 executor (given, or created for each run)."""

    #: Engine options this executor accepts, with their converters.
    constructor_options: list[tuple[str, Callable[[Any], Any]]] = [
        ("max_workers", _optional_int),
    ]

    def __init__(self, executor: cf.Executor | None = None, max_workers: int | None = None) -> None:
        self._executor = executor
        self._max_workers = max_workers
        self._own_executor = executor is None

    @abc.abstractmethod
    def _create_executor(self, max_workers: int | None = None) -> cf.Executor:
        """Make the executor used when none was given."""

    def _submit(self, fn: Callable[..., _T], *args: Any) -> cf.Future[_T]:
        if self._executor is None:
            # Used without start() (e.g. directly in a test): start lazily.
            self.start()
        executor = self._executor
        # Given at construction, or made by start() when none was.
        assert executor is not None
        return executor.submit(fn, *args)

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Arguments,
        progress_callback: ProgressCallback | None = None,
    ) -> OutcomeFuture:
        return self._submit(execute_task, task, arguments, progress_callback)

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: Arguments,
        result: Any,
        failures: Any,
        progress_callback: ProgressCallback | None = None,
    ) -> OutcomeFuture:
        return self._submit(revert_task, task, arguments, result, failures, progress_callback)

    def start(self) -> None:
        if self._own_executor and self._executor is None:
            self._executor = self._create_executor(max_workers=self._max_workers)

    def stop(self) -> None:
        if self._own_executor and self._executor is not None:
            executor, self._executor = self._executor, None
            # The engine only stops after every future it scheduled resolved,
            # so this returns as soon as the idle workers notice the shutdown
            # (no poll interval to sit out).
            executor.shutdown(wait=True)


class ParallelThreadTaskExecutor(ParallelTaskExecutor):
    """Runs tasks in parallel on a thread pool."""

    def _create_executor(self, max_workers: int | None = None) -> cf.Executor:
        return cf.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="flowengine-task")


class SerialRetryExecutor:
    """Runs retry controllers' execute/revert in the engine thread."""

    def start(self) -> None:
        """Nothing to prepare."""

    def stop(self) -> None:
        """Nothing to release."""

    def execute_retry(self, retry: Any, arguments: Arguments) -> OutcomeFuture:
        """Run ``retry.execute(**arguments)``; the future never raises."""
        try:
            result = retry.execute(**arguments)
        except Exception:
            result = ft.Failure()
        return completed_future((EXECUTED, result))

    def revert_retry(self, retry: Any, arguments: Arguments) -> OutcomeFuture:
        """Run ``retry.revert(**arguments)``; the future never raises."""
        try:
            result = retry.revert(**arguments)
        except Exception:
            result = ft.Failure()
        return completed_future((REVERTED, result))
