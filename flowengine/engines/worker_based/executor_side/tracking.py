"""The requests an executor waits on: routes, deadlines, attempts (executor side)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import discovery, remote_stats

LOG = logging.getLogger(__name__)

# Request states in which a request can still time out (seed 002).
TIMEOUT_STATES = pr.WAITING_STATES

Route = tuple[discovery.TopicWorker, str]


class Owner:
    """The engine a request was submitted for: its trace ids and its statistics.

    An executor serves one engine, or (shared, see :mod:`.sharing`) every
    engine of a process with the same broker and options; each request
    carries its engine's owner so that its headers name that engine's flow
    and its timings land in that engine's statistics.
    """

    __slots__ = ("root_id", "parent_id", "statistics")

    def __init__(
        self,
        statistics: remote_stats.RemoteStatistics,
        root_id: str | None = None,
        parent_id: str | None = None,
    ) -> None:
        self.statistics = statistics
        self.root_id = root_id
        self.parent_id = parent_id


class Tracked:
    """One request an executor waits on, with what the engine gave along.

    ``origin`` is the first dispatch (its future is the engine's); ``request``
    is the current one (a fresh Request each time it is dispatched again).
    """

    __slots__ = (
        "origin",
        "owner",
        "request",
        "progress_callback",
        "deadline",
        "routing_key",
        "topic",
        "attempt",
        "worker_id",
        "last_heard",
        "lost_after",
        "request_id",
        "run_deadline",
        "waiting_since",
        "awaiting_worker",
        "declined_by",
    )

    def __init__(
        self,
        request: pr.Request,
        progress_callback: Callable[..., Any] | None,
        deadline: float | None,
        owner: Owner,
    ) -> None:
        self.origin = request
        self.owner = owner
        self.request = request
        self.progress_callback = progress_callback
        self.deadline = deadline
        self.routing_key: str | None = None
        self.topic: str | None = None
        self.attempt = 0
        # Set from RUNNING replies of flowengine workers (TaskFlow's send no
        # worker_id and no heartbeats, so their requests are never "lost").
        self.worker_id: str | None = None
        self.last_heard: float | None = None
        #: Seconds of silence after which the holding worker is lost (set
        #: from its advertised heartbeat interval when it first answers).
        self.lost_after: float | None = None
        #: Id of this engine submission, the same on every attempt.
        self.request_id: str | None = None
        #: Monotonic time by which the current attempt must finish once
        #: RUNNING (None: no run time limit).
        self.run_deadline: float | None = None
        #: Monotonic time it started waiting for a capable worker (None: routed).
        self.waiting_since: float | None = None
        #: A worker that refused it before we knew that worker's tasks: the
        #: request is routed again only once that worker is known, so it is
        #: not sent to the same worker on the same stale routes.
        self.awaiting_worker: str | None = None
        #: A worker that got the current dispatch as a redelivery and handed
        #: it back unrun, while no holder was known (see RequestBook.await_holder).
        self.declined_by: str | None = None

    @property
    def uuid(self) -> str:
        """The request uuid (also the correlation id of its replies)."""
        return self.origin.uuid

    def set_route(self, route: Route | None) -> None:
        """Remember where the current dispatch goes (None: nowhere yet)."""
        if route is None:
            self.topic = self.routing_key = None
        else:
            self.topic, self.routing_key = route[0].topic, route[1]

    def resolve(self, result: Any) -> None:
        """Complete the engine's future with (EXECUTED|REVERTED, result)."""
        self.origin.set_result(result)


def transition(tracked: Tracked, state: str) -> bool:
    """Move the current request to ``state``; log (not raise) an invalid move."""
    request = tracked.request
    if request.current_state == state:
        return True
    try:
        request.transition(state)
    except exc.InvalidState:
        LOG.warning(
            "Request %s cannot move from %s to %s; ignoring it",
            request,
            request.current_state,
            state,
        )
        return False
    return True


class RequestBook:
    """Every unfinished request of one executor, by uuid, with its next deadline.

    ``lock`` guards all of it; methods marked "lock held" expect the caller
    to hold it, the others take it themselves.
    """

    def __init__(
        self, finder: discovery.ProxyWorkerFinder, transition_timeout: float | None
    ) -> None:
        self.lock = threading.Lock()
        self._finder = finder
        self._timeout = transition_timeout
        self._ongoing: dict[str, Tracked] = {}
        self._waiting: dict[str, Tracked] = {}
        self._next_deadline: float | None = None

    def __len__(self) -> int:
        return len(self._ongoing)

    @property
    def next_deadline(self) -> float | None:
        """Monotonic time of the earliest expiry or heartbeat check (None: none)."""
        return self._next_deadline

    def get(self, request_uuid: str) -> Tracked | None:
        """The tracked request with this uuid (None if finished or unknown)."""
        return self._ongoing.get(request_uuid)

    def is_current(self, tracked: Tracked) -> bool:
        """Whether ``tracked`` is still waited on (lock held)."""
        return self._ongoing.get(tracked.uuid) is tracked

    def remove(self, tracked: Tracked) -> None:
        """Stop tracking a finished request (lock held)."""
        self._ongoing.pop(tracked.uuid, None)
        self._waiting.pop(tracked.uuid, None)

    def _schedule(self, deadline: float | None) -> bool:
        """Lower the next deadline if needed; True when the scanner must wake (lock held)."""
        if deadline is None:
            return False
        if self._next_deadline is None or deadline < self._next_deadline:
            self._next_deadline = deadline
            return True
        return False

    def _route(self, tracked: Tracked, route: Route | None) -> None:
        """Move the current request to PENDING on ``route``, or make it wait (lock held)."""
        if route is None:
            tracked.set_route(None)
            tracked.waiting_since = time.monotonic()
            self._waiting[tracked.uuid] = tracked
        else:
            tracked.request.transition(pr.PENDING)
            tracked.set_route(route)

    def submit(self, tracked: Tracked) -> tuple[Route | None, bool]:
        """Track a new request and route it if a capable worker is known.

        Returns (route or None, whether the deadline scanner must wake).
        """
        with self.lock:
            previous = self._ongoing.get(tracked.uuid)
            if previous is not None:
                LOG.warning(
                    "Request %s replaces unfinished request %s with the same uuid",
                    tracked.request,
                    previous.request,
                )
                self._waiting.pop(tracked.uuid, None)
            self._ongoing[tracked.uuid] = tracked
            route = self._finder.get_route_for_task(tracked.request.task)
            self._route(tracked, route)
            if route is None:
                LOG.debug(
                    "No worker known that can run %s; %s waits for one",
                    discovery.task_class_name(tracked.request.task),
                    tracked.request,
                )
            return route, self._schedule(tracked.deadline)

    def new_attempt(
        self, tracked: Tracked, route_now: bool = True, after_worker: str | None = None
    ) -> tuple[Route | None, bool]:
        """Replace the current dispatch with a fresh Request and route it (lock held).

        With ``route_now`` False it waits for the next change of workers
        (and, with ``after_worker``, until that worker is known).
        Returns (route or None, whether the deadline scanner must wake).
        """
        request = tracked.request
        again = pr.Request(
            request.task,
            request.uuid,
            request.action,
            request.arguments,
            timeout=self._timeout,
            result=request.result,
            failures=request.failures,
        )
        tracked.request = again
        tracked.attempt += 1
        tracked.worker_id = tracked.last_heard = tracked.lost_after = None
        tracked.run_deadline = None
        tracked.awaiting_worker = after_worker
        tracked.declined_by = None
        tracked.deadline = None if self._timeout is None else again.created_on + self._timeout
        route = self._finder.get_route_for_task(request.task) if route_now else None
        self._route(tracked, route)
        return route, self._schedule(tracked.deadline)

    def heard(self, tracked: Tracked, worker_id: Any, lost_after_s: float) -> bool:
        """Note a PENDING/RUNNING (or heartbeat) from ``worker_id`` (lock held).

        Returns True if the deadline scanner must wake.
        """
        if worker_id is None:
            return False
        tracked.worker_id = str(worker_id)
        tracked.declined_by = None
        tracked.lost_after = lost_after_s
        tracked.last_heard = now = time.monotonic()
        return self._schedule(now + lost_after_s)

    def await_holder(self, tracked: Tracked, declined_by: str | None, grace_s: float) -> bool:
        """A redelivery of ``tracked`` was handed back unrun and no holder is known (lock held).

        Whoever took the first delivery (its acknowledgement lost with the
        broker) may still hold and run it: its PENDING or RUNNING would name
        it within ``grace_s``. Until then nothing is dispatched; after that,
        the housekeeper dispatches it again as if a holder had gone silent.
        Returns True if the deadline scanner must wake.
        """
        tracked.worker_id = None
        tracked.declined_by = declined_by or "unknown worker"
        tracked.lost_after = grace_s
        tracked.last_heard = now = time.monotonic()
        return self._schedule(now + grace_s)

    def forgive(self, now: float) -> int:
        """Restart the silence clock of every held request at ``now`` (monotonic s).

        For an executor that could hear nobody for a while (its own consumer
        was disconnected): that silence is not the workers'. Each request a
        worker holds (PENDING or RUNNING, heard from) gets
        ``last_heard = max(last_heard, now)``, so it is lost only after a full
        bound of silence from ``now``. Returns how many requests that covers.
        """
        forgiven = 0
        with self.lock:
            for tracked in self._ongoing.values():
                if (
                    tracked.request.current_state in (pr.PENDING, pr.RUNNING)
                    and tracked.last_heard is not None
                    and tracked.lost_after is not None
                ):
                    tracked.last_heard = max(tracked.last_heard, now)
                    forgiven += 1
                    # Lowers the next deadline only if none is set: an earlier
                    # one just wakes the scanner early, and scan() recomputes.
                    self._schedule(tracked.last_heard + tracked.lost_after)
        return forgiven

    def recheck(self, when: float) -> None:
        """Make the scanner look again at ``when`` (monotonic s) at the latest (lock held)."""
        self._schedule(when)

    def scanner_wakes_at(self, when: float) -> None:
        """The scanner looks again at ``when`` (monotonic s) anyway.

        A deadline after that needs no wake-up: it is seen then. Without
        this, a scan that found nothing due (the book empty between two
        tasks of a chain) left no deadline, and every new request woke the
        scanner, which, scanning after that request finished, found nothing
        again: a thread wake-up and a scan per task, for nothing.
        """
        with self.lock:
            self._schedule(when)

    def limit_run(self, tracked: Tracked, run_timeout_s: float | None) -> bool:
        """Start the run time limit of a request that just became RUNNING (lock held)."""
        if run_timeout_s is None or tracked.run_deadline is not None:
            return False
        tracked.run_deadline = time.monotonic() + run_timeout_s
        return self._schedule(tracked.run_deadline)

    def waiting(self) -> list[Tracked]:
        """Requests waiting for a capable worker, now."""
        with self.lock:
            return list(self._waiting.values())

    def release_waiting(self) -> list[Tracked]:
        """Route waiting requests some known worker can now run; return them (PENDING)."""
        ready: list[Tracked] = []
        with self.lock:
            for request_uuid, tracked in list(self._waiting.items()):
                if tracked.awaiting_worker is not None and not self._finder.has_worker(
                    tracked.awaiting_worker
                ):
                    continue
                route = self._finder.get_route_for_task(tracked.request.task)
                if route is None:
                    continue
                tracked.awaiting_worker = None
                del self._waiting[request_uuid]
                if transition(tracked, pr.PENDING):
                    tracked.set_route(route)
                    ready.append(tracked)
        return ready

    def scan(self, now: float) -> tuple[list[Tracked], list[Tracked], list[Tracked]]:
        """Find what is due at ``now`` (monotonic s): (expired, lost, overrun).

        expired: WAITING/PENDING past their transition deadline (moved to
        FAILURE and removed); lost: held by a worker (PENDING or RUNNING)
        that has been silent for its ``lost_after``; overrun: RUNNING past
        their run deadline (moved to FAILURE and removed).
        """
        expired: list[Tracked] = []
        lost: list[Tracked] = []
        overrun: list[Tracked] = []
        next_deadline: float | None = None
        with self.lock:
            for tracked in list(self._ongoing.values()):
                state = tracked.request.current_state
                dues: list[float] = []
                if state in TIMEOUT_STATES and tracked.deadline is not None:
                    if tracked.deadline <= now:
                        if transition(tracked, pr.FAILURE):
                            self.remove(tracked)
                            expired.append(tracked)
                        continue
                    dues.append(tracked.deadline)
                if state == pr.RUNNING and tracked.run_deadline is not None:
                    if tracked.run_deadline <= now:
                        if transition(tracked, pr.FAILURE):
                            self.remove(tracked)
                            overrun.append(tracked)
                        continue
                    dues.append(tracked.run_deadline)
                if (
                    state in (pr.PENDING, pr.RUNNING)
                    and tracked.last_heard is not None
                    and tracked.lost_after is not None
                ):
                    due = tracked.last_heard + tracked.lost_after
                    if due <= now:
                        lost.append(tracked)
                        continue
                    dues.append(due)
                for due in dues:
                    if next_deadline is None or due < next_deadline:
                        next_deadline = due
            self._next_deadline = next_deadline
        return expired, lost, overrun

    def holders(self, owner: Owner | None = None) -> dict[str, str]:
        """Request uuid -> id of the worker that holds it, for requests a worker took.

        Only ``owner``'s requests when given.
        """
        with self.lock:
            return {
                uuid: t.worker_id
                for uuid, t in self._ongoing.items()
                if t.worker_id is not None and (owner is None or t.owner is owner)
            }

    def drain(self, owner: Owner | None = None) -> list[Tracked]:
        """Stop tracking everything (or ``owner``'s requests); return what was unfinished."""
        with self.lock:
            if owner is None:
                leftovers = list(self._ongoing.values())
                self._ongoing.clear()
                self._waiting.clear()
                self._next_deadline = None
                return leftovers
            leftovers = [t for t in self._ongoing.values() if t.owner is owner]
            for tracked in leftovers:
                self.remove(tracked)
        return leftovers
