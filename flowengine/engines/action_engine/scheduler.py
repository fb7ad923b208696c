"""Hands ready atoms to their executors (tasks) or runs them (retries)."""

from __future__ import annotations

from typing import Any

from flowengine import states as st
from flowengine.engines.action_engine import analyzer as an
from flowengine.engines.action_engine import executor as ex
from flowengine.types import failure as ft


class Scheduler:
    """Starts the execution or reversion of atoms the analyzer found ready."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def schedule(
        self, ready: list[tuple[str, str]]
    ) -> tuple[dict[ex.OutcomeFuture, str], list[ft.Failure]]:
        """Start each ``(atom, EXECUTE|REVERT)``; return futures and start failures."""
        runtime = self._runtime
        atoms = runtime.atoms
        in_flight = runtime.analyzer.in_flight
        futures: dict[ex.OutcomeFuture, str] = {}
        failures: list[ft.Failure] = []
        for name, what in ready:
            atom = atoms[name]
            action = runtime.action_for(name)
            in_flight.add(name)
            try:
                if what == an.EXECUTE:
                    fut = action.schedule_execution(atom)
                elif runtime.analyzer.intention_of(name) == st.RETRY:
                    # Run the controller again: it goes RETRYING, its subflow
                    # back to PENDING (blocked until it succeeds), then RUNNING.
                    action.change_state(atom, st.RETRYING)
                    runtime.retry_subflow(name)
                    fut = action.schedule_execution(atom)
                else:
                    fut = action.schedule_reversion(atom)
            except Exception:
                in_flight.discard(name)
                failures.append(ft.Failure())
            else:
                futures[fut] = name
        return futures, failures
