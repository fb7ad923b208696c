"""A worker's task list: module names, class paths, modules or classes -> endpoints.

Only the classes a list names can ever run on a worker: a request naming any
other class gets an UnknownTask failure (see :mod:`.intake`).
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Iterable
from typing import TypeGuard

from flowengine import task as task_mod
from flowengine.engines.worker_based.worker_side import endpoint as endpoint_mod
from flowengine.utils import reflection

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
            raise ImportError(
                f"Task item {item!r} names neither a module nor a 'module.Class'"
            ) from e
        return [_checked_class(obj, item)]
    return _module_tasks(module)


def derive_endpoints(tasks: TaskItem | Iterable[TaskItem]) -> list[endpoint_mod.Endpoint]:
    """Endpoints for a task list of module names, class paths, modules or classes.

    Raises TypeError for an item of another kind, or naming a class that is
    no concrete Task; ImportError for a name that cannot be imported.
    """
    # One item alone (a name, a module, a class) stands for a list of it.
    items: list[object] = (
        [tasks] if isinstance(tasks, (str, bytes, type, types.ModuleType)) else list(tasks)
    )
    derived: dict[type[task_mod.BaseTask], None] = {}
    for item in items:
        if isinstance(item, str):
            classes = _import_item(item)
        elif isinstance(item, types.ModuleType):
            classes = _module_tasks(item)
        elif inspect.isclass(item):
            classes = [_checked_class(item, item)]
        else:
            raise TypeError(
                f"Item {item!r} has unexpected type {type(item).__name__};"
                f" expected a module name, a 'module:Class' string, a module"
                f" or a Task class"
            )
        for cls in classes:
            derived.setdefault(cls, None)
    return [endpoint_mod.Endpoint(cls) for cls in derived]
