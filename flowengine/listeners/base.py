"""Listener base classes: attach callbacks to an engine's notifiers as a unit.

A listener registers nothing until :meth:`Listener.register` (or entering it
as a context manager), so an engine without listeners pays nothing for them.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable
from typing import Any

from flowengine import states
from flowengine.types import failure
from flowengine.types.notifier import Notifier

LOG = logging.getLogger(__name__)

#: States in which a notification carries a usable ``result``.
FINISH_STATES = (states.FAILURE, states.SUCCESS, states.REVERTED, states.REVERT_FAILURE)

#: What a listener listens for unless told otherwise: every event.
DEFAULT_LISTEN_FOR = (Notifier.ANY,)

_Receiver = Callable[[str, dict[str, Any]], None]
_Filter = Callable[[Any], bool]
_Registration = list[tuple[str, _Receiver, _Filter | None]]


def _task_matcher(details: Any) -> bool:
    """Tell whether a notification is about a task (not a retry)."""
    return bool(details) and "task_name" in details and "task_uuid" in details


def _task_state_matcher(details: Any) -> bool:
    """Like _task_matcher, minus progress updates (they carry a 'progress' key).

    TaskFlow's engine never sends progress through the atom notifier, so a
    listener registered for every event must not see them: its output would
    gain lines TaskFlow never printed. Listing the progress event explicitly
    still delivers it.
    """
    return _task_matcher(details) and "progress" not in details


def _retry_matcher(details: Any) -> bool:
    """Tell whether a notification is about a retry controller."""
    return bool(details) and "retry_name" in details and "retry_uuid" in details


def _bulk_deregister(notifier: Notifier, registered: _Registration) -> None:
    while registered:
        event_type, callback, details_filter = registered.pop()
        notifier.deregister(event_type, callback, details_filter=details_filter)


def _bulk_register(
    event_types: Iterable[str],
    notifier: Notifier,
    callback: _Receiver,
    details_filter: _Filter | None = None,
    any_filter: _Filter | None = None,
) -> _Registration:
    """Register ``callback`` for each event type; ``any_filter`` applies to ANY."""
    registered: _Registration = []
    try:
        for event_type in event_types:
            chosen = details_filter
            if any_filter is not None and event_type == Notifier.ANY:
                chosen = any_filter
            if notifier.is_registered(event_type, callback, details_filter=chosen):
                continue
            notifier.register(event_type, callback, details_filter=chosen)
            registered.append((event_type, callback, chosen))
    except ValueError:
        # All or nothing: a refused event type undoes what this call added.
        _bulk_deregister(notifier, registered)
        raise
    return registered


class Listener:
    """Reacts to an engine's flow, task and retry state changes; override the receivers."""

    def __init__(
        self,
        engine: Any,
        task_listen_for: Iterable[str] | None = DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = DEFAULT_LISTEN_FOR,
    ) -> None:
        self._listen_for = {
            "task": list(task_listen_for or ()),
            "retry": list(retry_listen_for or ()),
            "flow": list(flow_listen_for or ()),
        }
        self._engine = engine
        self._registered: dict[str, _Registration] = {}

    def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
        """Called on each flow state change listened for (does nothing here)."""

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        """Called on each task state change listened for (does nothing here)."""

    def _retry_receiver(self, state: str, details: dict[str, Any]) -> None:
        """Called on each retry state change listened for (does nothing here)."""

    def register(self) -> None:
        """Attach the receivers to the engine's notifiers (idempotent)."""
        engine = self._engine
        if "task" not in self._registered:
            self._registered["task"] = _bulk_register(
                self._listen_for["task"],
                engine.atom_notifier,
                self._task_receiver,
                details_filter=_task_matcher,
                any_filter=_task_state_matcher,
            )
        if "retry" not in self._registered:
            self._registered["retry"] = _bulk_register(
                self._listen_for["retry"],
                engine.atom_notifier,
                self._retry_receiver,
                details_filter=_retry_matcher,
            )
        if "flow" not in self._registered:
            self._registered["flow"] = _bulk_register(
                self._listen_for["flow"], engine.notifier, self._flow_receiver
            )

    def deregister(self) -> None:
        """Detach every receiver this listener attached (idempotent)."""
        engine = self._engine
        if "task" in self._registered:
            _bulk_deregister(engine.atom_notifier, self._registered.pop("task"))
        if "retry" in self._registered:
            _bulk_deregister(engine.atom_notifier, self._registered.pop("retry"))
        if "flow" in self._registered:
            _bulk_deregister(engine.notifier, self._registered.pop("flow"))

    def __enter__(self) -> Listener:
        self.register()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        try:
            self.deregister()
        except Exception:
            # Leaving the block must not replace whatever the block raised.
            LOG.warning(
                "Failed deregistering listeners from engine %s", self._engine, exc_info=True
            )


class DumpingListener(Listener, metaclass=abc.ABCMeta):
    """Writes flow and task transitions as text; subclasses say where via ``_dump``."""

    @abc.abstractmethod
    def _dump(self, message: str, *args: Any, **kwargs: Any) -> None:
        """Output ``message % args``; ``exc_info`` may come in ``kwargs``."""

    def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
        self._dump(
            "%s has moved flow '%s' (%s) into state '%s' from state '%s'",
            self._engine,
            details["flow_name"],
            details["flow_uuid"],
            state,
            details["old_state"],
        )

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        if state not in FINISH_STATES:
            self._dump(
                "%s has moved task '%s' (%s) into state '%s' from state '%s'",
                self._engine,
                details["task_name"],
                details["task_uuid"],
                state,
                details["old_state"],
            )
            return
        result = details.get("result")
        was_failure = isinstance(result, failure.Failure)
        exc_info = None
        if isinstance(result, failure.Failure) and result.exc_info:
            exc_info = tuple(result.exc_info)
        self._dump(
            "%s has moved task '%s' (%s) into state '%s' from state '%s'"
            " with result '%s' (failure=%s)",
            self._engine,
            details["task_name"],
            details["task_uuid"],
            state,
            details["old_state"],
            result,
            was_failure,
            exc_info=exc_info,
        )
