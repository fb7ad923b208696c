"""Endpoint: one task class a worker can run, with its execute/revert entry points."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from flowengine import task as task_mod
from flowengine.types import failure as ft
from flowengine.types import notifier
from flowengine.utils import reflection

LOG = logging.getLogger(__name__)

ProgressCallback = Callable[[str, dict[str, Any]], None]


class Endpoint:
    """Represents a single task class with its execute and revert methods.

    execute()/revert() run the task in the calling thread and never raise:
    an exception from the task comes back as a Failure.
    """

    def __init__(self, task_cls: type[task_mod.BaseTask]) -> None:
        self._task_cls = task_cls
        self._task_cls_name = reflection.get_class_name(task_cls)

    def __str__(self) -> str:
        return self._task_cls_name

    def __repr__(self) -> str:
        return f"<Endpoint {self._task_cls_name}>"

    @property
    def name(self) -> str:
        """Fully qualified name of the task class (what requests name in task_cls)."""
        return self._task_cls_name

    @property
    def task_cls(self) -> type[task_mod.BaseTask]:
        """The task class itself."""
        return self._task_cls

    def generate(self, name: str | None = None) -> task_mod.BaseTask:
        """Create a task instance named ``name`` (the class must accept ``name=``)."""
        return self._task_cls(name=name)

    def execute(
        self,
        task: task_mod.BaseTask,
        arguments: dict[str, Any] | None = None,
        progress_callback: ProgressCallback | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``task.execute(**arguments)``; return its result or a Failure."""
        with _listening(task, progress_callback):
            try:
                task.pre_execute()
                return task.execute(**(arguments or {}))
            except Exception:
                return ft.Failure()
            finally:
                _quietly(task.post_execute)

    def revert(
        self,
        task: task_mod.BaseTask,
        arguments: dict[str, Any] | None = None,
        progress_callback: ProgressCallback | None = None,
        result: Any = None,
        failures: dict[str, ft.Failure] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``task.revert(**arguments, result=..., flow_failures=...)``; result or Failure."""
        call_args = dict(arguments or {})
        call_args[task_mod.REVERT_RESULT] = result
        call_args[task_mod.REVERT_FLOW_FAILURES] = failures or {}
        with _listening(task, progress_callback):
            try:
                task.pre_revert()
                return task.revert(**call_args)
            except Exception:
                return ft.Failure()
            finally:
                _quietly(task.post_revert)


def _listening(
    task: task_mod.BaseTask, callback: ProgressCallback | None
) -> contextlib.AbstractContextManager[None]:
    """Context manager: ``callback`` hears every event the task notifies while it runs.

    Progress and any other ``self.notifier.notify(event, details)`` of the
    task: the engine side hands each to the callbacks registered on its own
    copy of the task, as TaskFlow does.
    """
    return notifier.register_deregister(task.notifier, notifier.Notifier.ANY, callback=callback)


def _quietly(hook: Callable[[], None]) -> None:
    """Run a post_* hook; its exception must not replace the task's own outcome."""
    try:
        hook()
    except Exception:
        LOG.warning(
            "Task hook %s failed (ignored)", reflection.get_callable_name(hook), exc_info=True
        )
