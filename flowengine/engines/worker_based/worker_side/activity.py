"""What a worker is doing: the requests it holds, its counters, and cancellations.

:class:`Activity` is one of the worker's middleware (see :mod:`.middleware`):
it hears of each request's life and is read by the control server
(``flowengine inspect``). It is also where a cancellation lands: a request
held here is marked (a queued one is vetoed when a thread would start it; a
running one sees its context's cancellation flag, and the process executor
kills its child), and a request not held yet is remembered for a while so
that it is dropped unrun if it arrives later.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire import clock, names
from flowengine.engines.worker_based.worker_side.middleware import Job, Middleware
from flowengine.types import failure as ft

#: Seconds a cancellation of a request this worker does not hold is remembered:
#: longer than a request waits in a queue before its engine gives up on it
#: (the default transition timeout, 60 s), with room for a re-dispatch.
CANCEL_KEEP_S = 300.0

#: Cancellations remembered at most (oldest forgotten first).
CANCEL_MAX_ENTRIES = 10_000

# Where a request held here is, as ``inspect`` shows it.
QUEUED = "queued"
RUNNING = "running"


@dataclasses.dataclass
class Entry:
    """One request held here, as ``inspect`` reports it."""

    job: Job
    topic: str
    received_at: float
    state: str = QUEUED
    started_at: float | None = None
    thread_id: int | None = None

    @property
    def cancelled(self) -> threading.Event:
        """Set once the request is cancelled (the flag its body reads)."""
        return self.job.cancelled

    def describe(self, now: float) -> dict[str, Any]:
        """JSON-ready view: task, uuid, action, attempt, state and ages (s)."""
        work = self.job.work
        return {
            "uuid": self.job.task_uuid,
            "task": work.task_name,
            "task_cls": work.task_cls,
            "action": work.action,
            "attempt": self.job.headers.attempt or 0,
            "topic": self.topic,
            "state": self.state,
            "held_for_s": round(now - self.received_at, 3),
            "running_for_s": (None if self.started_at is None else round(now - self.started_at, 3)),
            "cancel_requested": self.cancelled.is_set(),
        }


@dataclasses.dataclass
class Counters:
    """Requests this worker handled since it started, by outcome."""

    received: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    retried: int = 0
    run_time_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counters."""
        return dataclasses.asdict(self) | {"run_time_s": round(self.run_time_s, 3)}


class Activity(Middleware):
    """The requests a worker holds and what happened to the others; thread-safe.

    ``kill_child(thread_id)`` (optional) stops the process running the body
    of the request on that pool thread (the process executor); True if it did.
    """

    def __init__(
        self,
        kill_child: Callable[[int], bool] | None = None,
        keep_s: float = CANCEL_KEEP_S,
        max_kept: int = CANCEL_MAX_ENTRIES,
    ) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str | None], Entry] = {}
        self._revoked: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self._kill_child = kill_child
        self._keep_s = keep_s
        self._max_kept = max_kept
        self.totals = Counters()
        self.by_task: dict[str, Counters] = collections.defaultdict(Counters)
        self.started_at = clock.wall()

    # --- the middleware hooks ---

    def after_receive(self, job: Job) -> None:
        """``job`` was taken (held, waiting for a thread)."""
        with self._lock:
            self._entries[job.key] = Entry(job, job.topic, clock.wall())
            for counters in (self.totals, self.by_task[job.work.task_name]):
                counters.received += 1
                if job.headers.attempt:
                    counters.retried += 1

    def refuse_start(self, job: Job) -> BaseException | None:
        """Veto: RequestCancelled when ``job`` was cancelled before it could start."""
        with self._lock:
            entry = self._entries.get(job.key)
            self._forget_old(time.monotonic())
            remembered = self._revoked.pop((job.task_uuid, job.work.action), None)
            if (entry is None or not entry.cancelled.is_set()) and remembered is None:
                return None
            for counters in (self.totals, self.by_task[job.work.task_name]):
                counters.cancelled += 1
        return exc.RequestCancelled(
            f"Request {job.task_uuid} ({job.work.action} of task"
            f" {job.work.task_name!r}) was cancelled before it"
            f" started"
        )

    def before_execute(self, job: Job) -> None:
        """``job``'s body starts on this thread: shown as running."""
        with self._lock:
            entry = self._entries.get(job.key)
            if entry is None:  # not received through us (a test's direct call)
                entry = self._entries[job.key] = Entry(job, job.topic, clock.wall())
            entry.state, entry.started_at = RUNNING, clock.wall()
            entry.thread_id = threading.get_ident()

    def after_execute(self, job: Job, result: Any, elapsed_s: float) -> None:
        """``job``'s body ended: counted, and no longer shown as held.

        Both before its event and outcome leave: whoever asks the worker
        after hearing of its end sees it counted.
        """
        failed = isinstance(result, ft.Failure)
        with self._lock:
            entry = self._entries.pop(job.key, None)
            cancelled = entry is not None and entry.cancelled.is_set() and failed
            for counters in (self.totals, self.by_task[job.work.task_name]):
                counters.run_time_s += elapsed_s
                if cancelled:
                    counters.cancelled += 1
                elif failed:
                    counters.failed += 1
                else:
                    counters.succeeded += 1

    def after_release(self, job: Job) -> None:
        """``job`` is no longer held."""
        with self._lock:
            self._entries.pop(job.key, None)

    # --- the control side ---

    def snapshot(self) -> list[dict[str, Any]]:
        """Every request held here (oldest first), JSON-ready."""
        now = clock.wall()
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: e.received_at)
            return [e.describe(now) for e in entries]

    def cancel(self, request_uuid: str) -> dict[str, Any]:
        """Cancel ``request_uuid`` here: what was found and done (JSON-ready).

        A request held and queued is dropped when a thread would start it;
        a running one gets its cancellation flag set (and its child killed
        under the process executor); one not held is remembered for
        CANCEL_KEEP_S so that it is dropped unrun if it arrives (its execute:
        the revert its engine sends afterwards must still run).
        """
        with self._lock:
            found = [e for e in self._entries.values() if e.job.task_uuid == request_uuid]
            for entry in found:
                entry.cancelled.set()
            if not found:
                self._revoked[(request_uuid, names.EXECUTE)] = time.monotonic()
                self._forget_old(time.monotonic())
        if not found:
            return {"request": request_uuid, "held": False, "remembered_s": self._keep_s}
        killed = False
        states = []
        for entry in found:
            states.append(entry.state)
            if (
                entry.state == RUNNING
                and entry.thread_id is not None
                and self._kill_child is not None
            ):
                killed = self._kill_child(entry.thread_id) or killed
        return {"request": request_uuid, "held": True, "states": states, "process_killed": killed}

    def _forget_old(self, now: float) -> None:
        """Drop cancellations older than keep_s, and the oldest past max_kept (lock held)."""
        while self._revoked:
            key, when = next(iter(self._revoked.items()))
            if now - when < self._keep_s and len(self._revoked) <= self._max_kept:
                return
            del self._revoked[key]
