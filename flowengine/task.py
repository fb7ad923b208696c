"""Tasks: atoms that do work (execute) and can undo it (revert)."""

from __future__ import annotations

import abc
import copy
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import atom
from flowengine.types import notifier
from flowengine.types.notifier import RestrictedNotifier
from flowengine.utils import misc, reflection

LOG = logging.getLogger(__name__)

#: Keyword argument of revert holding execute's result (or its Failure).
REVERT_RESULT = atom.REVERT_RESULT
#: Keyword argument of revert holding the failures that made the flow revert.
REVERT_FLOW_FAILURES = atom.REVERT_FLOW_FAILURES

#: Event a task emits through its notifier when it reports progress.
EVENT_UPDATE_PROGRESS = "update_progress"

# Making a task's notifier on first use, or dropping it, is one step under
# this lock: two threads touching a task's notifier first at once (two
# engines running the same task, a listener registered while it runs) must
# not each make one and lose the other's registrations.
_NOTIFIER_LOCK = threading.Lock()


class BaseTask(atom.Atom, metaclass=abc.ABCMeta):
    """A task: an atom with a per-instance notifier for internal events (progress)."""

    #: Events callbacks may be registered for on ``task.notifier``.
    TASK_EVENTS: tuple[str, ...] = (EVENT_UPDATE_PROGRESS,)

    def __init__(
        self,
        name: str | None = None,
        provides: Any = None,
        requires: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        inject: Mapping[str, Any] | None = None,
        ignore_list: Any = None,
        revert_rebind: Any = None,
        revert_requires: Any = None,
    ) -> None:
        if name is None:
            name = reflection.get_class_name(self)
        super().__init__(
            name,
            provides=provides,
            requires=requires,
            auto_extract=auto_extract,
            rebind=rebind,
            inject=inject,
            ignore_list=ignore_list,
            revert_rebind=revert_rebind,
            revert_requires=revert_requires,
        )
        # Made on first use (see the notifier property): most tasks of a large
        # flow never get a listener, and one object less per task is one less
        # the collector walks in each full pass over a 100,000-task flow.
        self._made_notifier: notifier.RestrictedNotifier | None = None

    #: Set once the notifier was handed to anyone but the engine: then it is
    #: never dropped, so a reference taken while the engine held the one it
    #: made stays this task's notifier (a class default: no slot per task).
    _notifier_handed_out = False

    @property
    def notifier(self) -> notifier.RestrictedNotifier:
        """Notifier of this task's internal events (e.g. 'update_progress')."""
        # Marked before it is read: _drop_notifier_if_idle either ran before
        # (and this makes a fresh one) or sees the mark.
        if not self._notifier_handed_out:
            self._notifier_handed_out = True
        return self._engine_notifier()

    def _engine_notifier(self) -> RestrictedNotifier:
        """The notifier, made if need be, as the engine asks for it (not marked handed out)."""
        made = self._made_notifier
        if made is None:
            fresh = notifier.RestrictedNotifier(self.TASK_EVENTS)
            with _NOTIFIER_LOCK:
                made = self._made_notifier
                if made is None:
                    made = self._made_notifier = fresh
        return made

    @property
    def _notifier(self) -> RestrictedNotifier:
        # TaskFlow's tasks keep their notifier in this attribute, and code
        # written for TaskFlow uses it (Masakari's tasks call
        # self._notifier.notify): the same notifier, made on first use.
        return self.notifier

    @_notifier.setter
    def _notifier(self, value: RestrictedNotifier) -> None:
        self._made_notifier = value

    def _drop_notifier_if_idle(self, made: RestrictedNotifier) -> None:
        """Forget ``made`` (this task's notifier) if nothing is registered on it any more.

        The engine calls it after an execute/revert whose progress listener
        made the notifier: kept, each task of a large flow would hold one.
        """
        with _NOTIFIER_LOCK:
            if self._made_notifier is made and not made and not self._notifier_handed_out:
                self._made_notifier = None

    def copy(self, retain_listeners: bool = True) -> BaseTask:
        """Return a shallow copy with its own notifier (listeners kept or dropped)."""
        clone = copy.copy(self)
        made = self._made_notifier
        if made is not None:
            clone._made_notifier = made.copy() if retain_listeners else None
        return clone

    def update_progress(self, progress: float) -> None:
        """Report progress in [0.0, 1.0] (values outside are clamped, with a warning)."""
        if 0.0 <= progress <= 1.0:
            # The usual case (the engine reports 0.0 and 1.0 for every task);
            # a notifier not made yet has no listener to tell.
            made = self._made_notifier
            if made is not None:
                made.notify(EVENT_UPDATE_PROGRESS, {"progress": progress})
            return

        def on_clamped() -> None:
            LOG.warning(
                "Progress value must be greater or equal to 0.0 or less"
                " than or equal to 1.0 instead of being '%s'",
                progress,
            )

        cleaned = misc.clamp(progress, 0.0, 1.0, on_clamped=on_clamped)
        self.notifier.notify(EVENT_UPDATE_PROGRESS, {"progress": cleaned})


class Task(BaseTask, metaclass=abc.ABCMeta):
    """Base class for user tasks: define execute (and optionally revert)."""


class FunctorTask(Task):
    """A task made from a callable (and an optional revert callable)."""

    def __init__(
        self,
        execute: Callable[..., Any],
        name: str | None = None,
        provides: Any = None,
        requires: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        revert: Callable[..., Any] | None = None,
        version: Any = None,
        inject: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(execute):
            raise ValueError("Function to use for executing must be callable")
        if revert is not None and not callable(revert):
            raise ValueError("Function to use for reverting must be callable")
        if name is None:
            name = reflection.get_callable_name(execute)
        super().__init__(name, provides=provides, inject=inject)
        self._execute = execute
        self._revert = revert
        if version is not None:
            self.version = version
        # Map the callables' own signatures, not this class's *args methods.
        self.rebind, exec_requires, self.optional = self._build_arg_mapping(
            execute, requires, rebind, auto_extract
        )
        if revert is not None:
            (self.revert_rebind, self.revert_requires, self.revert_optional) = (
                self._build_arg_mapping(
                    revert, requires, rebind, auto_extract, ignore_list=atom._ENGINE_REVERT_ARGS
                )
            )
        else:
            self.revert_rebind = self.rebind
            self.revert_requires = exec_requires
            self.revert_optional = self.optional
        self.requires = exec_requires.union(self.revert_requires)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped execute callable."""
        return self._execute(*args, **kwargs)

    def revert(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped revert callable, if any."""
        if self._revert is None:
            return None
        return self._revert(*args, **kwargs)


def _check_functor_inputs(
    functor: Callable[..., Any], requires: Any, kind: str, arg_count: int
) -> None:
    if not callable(functor):
        raise ValueError(f"Function to use for {kind} must be callable")
    f_args = reflection.get_callable_args(functor)
    if len(f_args) != arg_count:
        plural = "argument" if arg_count == 1 else "arguments"
        raise ValueError(
            f"{len(f_args)} arguments were provided. {kind.capitalize()}"
            f" functor must take exactly {arg_count} {plural}."
        )
    if not misc.is_iterable(requires):
        raise TypeError(
            f"{type(requires)} type was provided for requires. Requires must be an iterable."
        )


class _CollectionFunctorTask(Task):
    """Common part of map/reduce tasks: the inputs are the ``requires`` symbols, in order."""

    def __init__(
        self,
        functor: Callable[..., Any],
        requires: Any,
        name: str | None,
        provides: Any,
        auto_extract: bool,
        rebind: Any,
        inject: Mapping[str, Any] | None,
    ) -> None:
        if name is None:
            name = reflection.get_callable_name(functor)
        super().__init__(
            name=name,
            provides=provides,
            inject=inject,
            requires=requires,
            rebind=rebind,
            auto_extract=auto_extract,
        )
        self._functor = functor
        # execute receives one keyword per requirement (its argument name).
        self._input_args = [a for a in requires if a in self.rebind]

    def _inputs(self, kwargs: dict[str, Any]) -> list[Any]:
        return [kwargs[a] for a in self._input_args]


class ReduceFunctorTask(_CollectionFunctorTask):
    """Reduce the values of the required symbols with a two-argument callable."""

    def __init__(
        self,
        functor: Callable[..., Any],
        requires: Any,
        name: str | None = None,
        provides: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        inject: Mapping[str, Any] | None = None,
    ) -> None:
        _check_functor_inputs(functor, requires, "reduce", 2)
        if len(requires) < 2:
            raise ValueError(
                f"{len(requires)} elements were provided. Requires must have at least 2 elements."
            )
        super().__init__(functor, requires, name, provides, auto_extract, rebind, inject)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Return functools.reduce(functor, values of the requirements)."""
        return functools.reduce(self._functor, self._inputs(kwargs))


class MapFunctorTask(_CollectionFunctorTask):
    """Map a one-argument callable over the values of the required symbols."""

    def __init__(
        self,
        functor: Callable[..., Any],
        requires: Any,
        name: str | None = None,
        provides: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        inject: Mapping[str, Any] | None = None,
    ) -> None:
        _check_functor_inputs(functor, requires, "map", 1)
        super().__init__(functor, requires, name, provides, auto_extract, rebind, inject)

    def execute(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Return [functor(v) for v in values of the requirements]."""
        return [self._functor(v) for v in self._inputs(kwargs)]
