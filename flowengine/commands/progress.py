"""A rich progress bar driven by atom states and task progress notifications."""

from __future__ import annotations

import threading
from typing import Any

from flowengine import states as st

#: Atom states after which an atom counts as done for the bar.
DONE_STATES = (st.SUCCESS, st.FAILURE, st.REVERTED, st.REVERT_FAILURE, st.IGNORE)


class FlowProgress:
    """Shows one overall bar (atoms done / total) plus a line per running task.

    A task's line follows its ``update_progress()`` calls (for remote tasks
    they arrive as EVENT replies). Register with :meth:`attach`.
    """

    def __init__(self, total: int, console: Any = None, description: str = "flow") -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._overall = self._progress.add_task(description, total=total)
        self._running: dict[str, Any] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()
        self.states: dict[str, str] = {}

    def attach(self, engine: Any) -> None:
        """Listen to ``engine``'s atom state changes and task progress."""
        engine.atom_notifier.register(engine.atom_notifier.ANY, self.on_atom)
        engine.atom_notifier.register("update_progress", self.on_progress)

    def start(self) -> None:
        """Start drawing (a thread redraws the bars)."""
        self._progress.start()

    def finish(self) -> None:
        """Draw the final state and stop redrawing."""
        self._progress.stop()

    def __enter__(self) -> FlowProgress:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.finish()

    def on_atom(self, state: str, details: dict[str, Any]) -> None:
        """Atom notifier callback: move the bar, add/remove per-task lines."""
        name = details.get("task_name") or details.get("retry_name") or details.get("atom_name")
        if name is None or state == "update_progress":
            return
        with self._lock:
            self.states[name] = state
            if state == st.RUNNING and name not in self._running:
                self._running[name] = self._progress.add_task(f"  {name}", total=1.0)
            elif state in DONE_STATES:
                line = self._running.pop(name, None)
                if line is not None:
                    self._progress.remove_task(line)
                if name not in self._done:
                    self._done.add(name)
                    self._progress.update(self._overall, completed=len(self._done))
            elif state in (st.PENDING, st.RETRYING, st.REVERTING) and name in self._done:
                # Reverted and run again by a retry: not done any more.
                self._done.discard(name)
                self._progress.update(self._overall, completed=len(self._done))

    def on_progress(self, event_type: str, details: dict[str, Any]) -> None:
        """Task progress notification: move that task's own bar."""
        name = details.get("task_name") or details.get("atom_name")
        progress = details.get("progress")
        with self._lock:
            line = self._running.get(name) if name is not None else None
            if line is not None and progress is not None:
                self._progress.update(line, completed=float(progress))

    @property
    def done(self) -> int:
        """How many atoms are done."""
        with self._lock:
            return len(self._done)
