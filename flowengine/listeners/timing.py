"""Listeners that time tasks and flows and store the figures in metadata."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.listeners import base

LOG = logging.getLogger(__name__)

#: States in which an atom or flow starts doing work.
STARTING_STATES = frozenset((states.RUNNING, states.REVERTING))

#: States in which that work is over (a duration can be recorded).
FINISHED_STATES = frozenset(base.FINISH_STATES + (states.REVERTED,))

#: Everything the duration listeners need to hear about.
WATCH_STATES = frozenset(FINISHED_STATES | STARTING_STATES | {states.PENDING})

# Item kinds, spelled as the compiler spells node kinds (they appear in output).
TASK = "task"
FLOW = "flow"


class _StopWatch:
    """Monotonic timer: wall-clock steps must not produce negative durations."""

    __slots__ = ("_started", "_stopped")

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._stopped: float | None = None

    def stop(self) -> None:
        self._stopped = time.monotonic()

    def elapsed(self) -> float:
        end = self._stopped if self._stopped is not None else time.monotonic()
        return max(0.0, end - self._started)


class DurationListener(base.Listener):
    """Saves how long each task and the flow ran, in seconds, as metadata ``'duration'``."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine, task_listen_for=WATCH_STATES, flow_listen_for=WATCH_STATES)
        self._timers: dict[str, dict[str, _StopWatch]] = {TASK: {}, FLOW: {}}

    def deregister(self) -> None:
        super().deregister()
        # Every started item should have finished by now; say so if not.
        for item_type, timers in self._timers.items():
            if timers:
                LOG.warning(
                    "%s %s(s) did not enter %s states", len(timers), item_type, FINISHED_STATES
                )
            timers.clear()

    def _record_ending(self, timer: _StopWatch, item_type: str, item_name: str, state: str) -> None:
        meta_update = {"duration": timer.elapsed()}
        try:
            storage = self._engine.storage
            if item_type == FLOW:
                storage.update_flow_metadata(meta_update)
            else:
                storage.update_atom_metadata(item_name, meta_update)
        except exc.StorageFailure:
            # A listener must never break the run it watches.
            LOG.warning(
                "Failure to store duration update %s for %s %s",
                meta_update,
                item_type,
                item_name,
                exc_info=True,
            )

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        self._receiver(TASK, details["task_name"], state)

    def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
        self._receiver(FLOW, details["flow_name"], state)

    def _receiver(self, item_type: str, item_name: str, state: str) -> None:
        timers = self._timers[item_type]
        if state == states.PENDING:
            timers.pop(item_name, None)
        elif state in STARTING_STATES:
            timers[item_name] = _StopWatch()
        elif state in FINISHED_STATES:
            timer = timers.pop(item_name, None)
            if timer is not None:
                timer.stop()
                self._record_ending(timer, item_type, item_name, state)


class PrintingDurationListener(DurationListener):
    """Records durations like DurationListener and also prints starts and durations."""

    def __init__(self, engine: Any, printer: Callable[[str], Any] | None = None) -> None:
        super().__init__(engine)
        self._printer = print if printer is None else printer

    def _record_ending(self, timer: _StopWatch, item_type: str, item_name: str, state: str) -> None:
        super()._record_ending(timer, item_type, item_name, state)
        self._printer(
            f"It took {item_type} '{item_name}' {timer.elapsed():0.2f} seconds to finish."
        )

    def _receiver(self, item_type: str, item_name: str, state: str) -> None:
        super()._receiver(item_type, item_name, state)
        if state in STARTING_STATES:
            self._printer(f"'{item_name}' {item_type} started.")


class EventTimeListener(base.Listener):
    """Saves the unix time of each event as metadata ``'<state>-timestamp'``."""

    def __init__(
        self,
        engine: Any,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )

    def _record_atom_event(self, state: str, atom_name: str) -> None:
        meta_update = {f"{state}-timestamp": time.time()}
        try:
            self._engine.storage.update_atom_metadata(atom_name, meta_update)
        except exc.StorageFailure:
            LOG.warning(
                "Failure to store timestamp %s for atom %s", meta_update, atom_name, exc_info=True
            )

    def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
        meta_update = {f"{state}-timestamp": time.time()}
        try:
            self._engine.storage.update_flow_metadata(meta_update)
        except exc.StorageFailure:
            LOG.warning(
                "Failure to store timestamp %s for flow %s",
                meta_update,
                details["flow_name"],
                exc_info=True,
            )

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        self._record_atom_event(state, details["task_name"])

    def _retry_receiver(self, state: str, details: dict[str, Any]) -> None:
        self._record_atom_event(state, details["retry_name"])
