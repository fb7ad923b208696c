"""Scheduling and completing tasks (execute, revert, progress)."""

from __future__ import annotations

import logging
from typing import Any

from flowengine import states
from flowengine.engines.action_engine import executor as ex
from flowengine.engines.action_engine.actions import base
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)


class TaskAction(base.Action):
    """Moves tasks through RUNNING/SUCCESS/FAILURE/REVERTING/... via an executor."""

    name_key = "task_name"
    uuid_key = "task_uuid"

    def __init__(
        self,
        storage: Any,
        notifier: Any,
        tracker: Any,
        uuid_of: Any,
        state_of: Any,
        fetch_args: Any,
        task_executor: ex.TaskExecutor,
    ) -> None:
        super().__init__(storage, notifier, tracker, uuid_of, state_of, fetch_args)
        self._executor = task_executor
        # Last progress saved per unfinished task, to skip rewriting an
        # unchanged value.
        self._progress: dict[str, float] = {}

    def _set_progress(
        self, task: Any, progress: float, store: bool = False, report: bool = True
    ) -> None:
        # The engine itself reports 0.0 when a task starts and 1.0 when it
        # ends (on the task's notifier, as TaskFlow); storage is only written
        # when the value changes (or ``store`` says to).
        name = task.name
        known = self._progress.get(name)
        if known is None:
            known = self._storage.get_task_progress(name)
        if store or known != progress:
            self._storage.set_task_progress(name, progress)
        if progress == 1.0:
            # Finished: keep entries for running tasks only (one per task
            # would last the whole run); a revert reads storage once.
            self._progress.pop(name, None)
        else:
            self._progress[name] = progress
        if report:
            task.update_progress(progress)

    def change_state(
        self, atom: Any, state: str, result: Any = base.NO_RESULT, progress: float | None = None
    ) -> None:
        """Move a task to ``state`` and optionally record its progress."""
        super().change_state(atom, state, result)
        if progress is not None:
            self._set_progress(atom, progress)

    def reset(self, task: Any, state: str) -> None:
        """Move a task to ``state`` (PENDING, IGNORE...) with its progress back to 0.0.

        As TaskFlow's reset: when the state changes, the 0.0 is stored in the
        task's meta even where no progress was recorded yet (an IGNOREd task's
        meta is ``{'progress': 0.0}``). Only a reset to PENDING reports the
        0.0 on the task's notifier, as flowengine always did.
        """
        changed = self._state_of(task.name) != state
        super().change_state(task, state)
        self._set_progress(task, 0.0, store=changed, report=state == states.PENDING)

    def _progress_callback(self, task: Any) -> ex.ProgressCallback | None:
        if getattr(task, "_made_notifier", True) is None:
            # Not made yet (flowengine.task.BaseTask): it will accept the
            # task's own events; asking it would make it for nothing.
            if ex.EVENT_UPDATE_PROGRESS not in task.TASK_EVENTS:
                return None
        elif not task.notifier.can_be_registered(ex.EVENT_UPDATE_PROGRESS):
            return None
        name = task.name
        notify = self._notifier.notify

        def on_progress(event_type: str, details: dict[str, Any]) -> None:
            # Runs wherever the task runs (a pool thread for the parallel
            # engine); storage is thread-safe and notifier callbacks may be
            # called from any thread.
            details = dict(details)
            progress = details.pop("progress", None)
            if progress is None:
                return
            try:
                self._progress[name] = progress
                # An update without details clears earlier ones (stored as
                # None), as TaskFlow does: pass the empty dict on.
                self._storage.set_task_progress(name, progress, details=details)
            except Exception:
                LOG.exception("Failed saving progress %s of task '%s'", progress, name)
            notify(
                ex.EVENT_UPDATE_PROGRESS,
                {
                    "task_name": name,
                    "task_uuid": self._uuid_of(name),
                    "progress": progress,
                    "details": details,
                    "old_state": states.RUNNING,
                },
            )

        return on_progress

    def schedule_execution(self, task: Any) -> ex.OutcomeFuture:
        """Mark the task RUNNING and hand it to the executor."""
        name = task.name
        self.change_state(task, states.RUNNING, progress=0.0)
        arguments = self._fetch_args(name, False)
        return self._executor.execute_task(
            task, self._uuid_of(name), arguments, progress_callback=self._progress_callback(task)
        )

    def complete_execution(self, task: Any, result: Any) -> None:
        """Save what execute returned (a Failure means the task failed)."""
        if isinstance(result, ft.Failure):
            self.change_state(task, states.FAILURE, result=result)
        else:
            self.change_state(task, states.SUCCESS, result=result, progress=1.0)

    def schedule_reversion(self, task: Any) -> ex.OutcomeFuture:
        """Mark the task REVERTING and hand its revert to the executor."""
        name = task.name
        self.change_state(task, states.REVERTING, progress=0.0)
        arguments = self._fetch_args(name, True)
        result = self._storage.get(name)
        failures = self._storage.get_execute_failures()
        return self._executor.revert_task(
            task,
            self._uuid_of(name),
            arguments,
            result,
            failures,
            progress_callback=self._progress_callback(task),
        )

    def complete_reversion(self, task: Any, result: Any) -> None:
        """Save what revert returned (a Failure means the revert failed)."""
        if isinstance(result, ft.Failure):
            self.change_state(task, states.REVERT_FAILURE, result=result)
        else:
            self.change_state(task, states.REVERTED, result=result, progress=1.0)
