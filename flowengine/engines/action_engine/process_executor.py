"""Runs tasks in child processes (``executor='processes'`` on the parallel engine).

The task object and its arguments are pickled into the child (as TaskFlow does;
no broker is involved, so this stays on the local machine). Results come back
pickled too; a Failure pickles as its JSON form plus its exception (when that
pickles), so the engine can re-raise the task's own exception type.
Progress a task reports in the child is replayed on the engine side when the
task finishes (the child has no channel back while it runs).

Children are started by a ``forkserver``, not forked from the engine: the
engine's process usually has other threads (brokers' I/O, listeners) whose
locks a plain fork copies in a held state, so a forked child could hang
forever. The price is the same rule remote workers have: task classes must be
importable by their module name.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from typing import Any

from flowengine.engines.action_engine import executor as ex
from flowengine.types import failure as ft

# See the module docstring: forking a threaded engine process can deadlock.
_START_METHOD = "forkserver"


#: A progress event recorded in the child: ``(event_type, details)``.
_Event = tuple[str, dict[str, Any]]

#: What a child process sends back: its outcome and the progress it reported.
_ChildResult = tuple[ex.Outcome, list[_Event]]


class _ProgressRecorder:
    """Collects a task's progress events in the child process."""

    def __init__(self) -> None:
        self.events: list[_Event] = []

    def __call__(self, event_type: str, details: dict[str, Any]) -> None:
        self.events.append((event_type, dict(details)))


def _child_execute(task: Any, arguments: ex.Arguments, want_progress: bool) -> _ChildResult:
    recorder = _ProgressRecorder() if want_progress else None
    outcome, result = ex.execute_task(task, arguments, recorder)
    return (outcome, result), (recorder.events if recorder else [])


def _child_revert(
    task: Any, arguments: ex.Arguments, result: Any, failures: Any, want_progress: bool
) -> _ChildResult:
    recorder = _ProgressRecorder() if want_progress else None
    outcome, value = ex.revert_task(task, arguments, result, failures, recorder)
    return (outcome, value), (recorder.events if recorder else [])


def _without_listeners(task: Any) -> Any:
    # Listeners registered on the task (often closures) need not, and usually
    # cannot, be pickled into the child: send a copy without them.
    if len(getattr(task, "notifier", ())) and hasattr(task, "copy"):
        return task.copy(retain_listeners=False)
    return task


class ParallelProcessTaskExecutor(ex.ParallelTaskExecutor):
    """Runs tasks in parallel in a pool of child processes."""

    def _create_executor(self, max_workers: int | None = None) -> cf.Executor:
        return cf.ProcessPoolExecutor(
            max_workers=max_workers, mp_context=multiprocessing.get_context(_START_METHOD)
        )

    def _relay(
        self,
        inner: cf.Future[_ChildResult],
        outcome_if_lost: str,
        progress_callback: ex.ProgressCallback | None,
    ) -> ex.OutcomeFuture:
        outer: ex.OutcomeFuture = cf.Future()

        def _done(fut: cf.Future[_ChildResult]) -> None:
            try:
                (outcome, value), events = fut.result()
            except BaseException as e:  # child died, or the task did not pickle
                outer.set_result((outcome_if_lost, ft.Failure.from_exception(e)))
                return
            if progress_callback is not None:
                for event_type, details in events:
                    try:
                        progress_callback(event_type, details)
                    except Exception:  # progress must never break completion
                        pass
            outer.set_result((outcome, value))

        inner.add_done_callback(_done)
        return outer

    def execute_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: ex.Arguments,
        progress_callback: ex.ProgressCallback | None = None,
    ) -> ex.OutcomeFuture:
        inner = self._submit(
            _child_execute, _without_listeners(task), arguments, progress_callback is not None
        )
        return self._relay(inner, ex.EXECUTED, progress_callback)

    def revert_task(
        self,
        task: Any,
        task_uuid: str,
        arguments: ex.Arguments,
        result: Any,
        failures: Any,
        progress_callback: ex.ProgressCallback | None = None,
    ) -> ex.OutcomeFuture:
        inner = self._submit(
            _child_revert,
            _without_listeners(task),
            arguments,
            result,
            failures,
            progress_callback is not None,
        )
        return self._relay(inner, ex.REVERTED, progress_callback)
