"""Per-atom timings of remote requests, for the engine's ``statistics``."""

from __future__ import annotations

import threading
import time
from typing import Any


class RemoteStatistics:
    """Queue time, run time and attempts of each remote atom, by atom name.

    ``run_time`` is how long the body ran, as its worker measured it (header
    ``run_s``; a TaskFlow worker does not say, and then it is the time from
    its RUNNING reply to the outcome); ``queue_time`` the rest of the time
    from the first dispatch to the outcome. (The RUNNING reply itself is no
    clock: a flowengine worker sends it only 50 ms into a body.)
    ``attempts`` how many executions of the atom finished (a Retry
    controller runs an atom again); ``dispatches`` how often the
    last request was sent (a lost worker makes the executor send it again).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._atoms: dict[str, dict[str, Any]] = {}

    def record(self, tracked: Any, run_s: float | None = None) -> None:
        """Note the outcome of ``tracked`` (a tracking.Tracked), just before it resolves.

        ``run_s``: how long its body ran, by its worker (None if it did not say).
        """
        now = time.monotonic()
        request, origin = tracked.request, tracked.origin
        running_since = request.created_on + request.elapsed
        if run_s is not None:
            running_since = max(request.created_on, now - run_s)
        name = getattr(origin.task, "name", str(origin.task))
        with self._lock:
            entry = self._atoms.setdefault(name, {"attempts": 0, "reverts": 0})
            if request.action == "revert":
                entry["reverts"] += 1
                entry["revert_time"] = now - running_since
                return
            entry["attempts"] += 1
            entry["queue_time"] = max(0.0, running_since - origin.created_on)
            entry["run_time"] = max(0.0, now - running_since)
            entry["dispatches"] = tracked.attempt + 1
            entry["worker_id"] = tracked.worker_id

    def of(self, name: str) -> dict[str, Any] | None:
        """A copy of one atom's entry (None: no outcome recorded yet)."""
        with self._lock:
            entry = self._atoms.get(name)
            return None if entry is None else dict(entry)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """A copy of the table: atom name -> timings."""
        with self._lock:
            return {name: dict(entry) for name, entry in self._atoms.items()}

    def clear(self) -> None:
        """Forget everything (a new run starts)."""
        with self._lock:
            self._atoms.clear()
