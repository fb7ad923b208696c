"""The executor's housekeeping: deadlines, lost requests, grace after its own outage.

Runs beside the request path in a thread of its own: it fails requests
nobody started in time or that ran too long, dispatches again the requests
whose worker fell silent, refreshes discovery and forgets silent workers.
Silence only counts while the executor could hear: see
:meth:`Housekeeper.consumer_ticked` and :meth:`Housekeeper.consumer_started`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import discovery, unserved
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.engines.worker_based.executor_side.publisher import RequestPublisher
from flowengine.engines.worker_based.wire.request import Request

LOG = logging.getLogger(__name__)

# Seconds between two rounds of the reply consumer's loop when no reply
# arrives. A request is only declared lost once the consumer has gone round
# after its deadline, so an executor whose own threads were starved (a busy
# process, a paused VM) never blames a worker for replies it had not read
# yet; short, because it adds to the detection time.
CONSUMER_TICK_S = 0.1

# Lost requests remembered in ``lost_history`` (diagnostics, tests).
LOST_HISTORY_MAX = 1000

# Upper bound, in seconds, on how long the housekeeping thread sleeps when it
# has nothing scheduled: it wakes early on any new deadline, so this only
# bounds how late a stop() or a clock jump is noticed.
HOUSEKEEPING_MAX_SLEEP_S = 5.0


class LostRecord(
    collections.namedtuple("LostRecord", "request_uuid worker_id attempt silent_s detected_at")
):
    """One request found lost: whose worker, which attempt, after how long a silence."""


class Housekeeper:
    """Expiry, lost-request recovery and discovery upkeep of one executor.

    ``requests`` publishes a request again and fails one; ``unserved``
    says why requests nobody can take wait. Call :meth:`run` in a thread of
    its own and :meth:`stop` to end it.
    """

    def __init__(
        self,
        executor_uuid: str,
        book: tr.RequestBook,
        finder: discovery.ProxyWorkerFinder,
        policy: RequestPolicy,
        requests: RequestPublisher,
        unserved_watch: unserved.UnservedWatch,
    ) -> None:
        self._uuid = executor_uuid
        self._book = book
        self._finder = finder
        self._policy = policy
        self._requests = requests
        self._unserved = unserved_watch
        self._wake = threading.Event()
        self._stopping = threading.Event()
        # Monotonic time the reply consumer last went round its loop.
        self._consumer_tick = time.monotonic()
        # Consumer reconnections already answered with a grace.
        self._reconnects_seen = 0
        #: The latest requests found lost (oldest first).
        self.lost_history: collections.deque[LostRecord] = collections.deque(
            maxlen=LOST_HISTORY_MAX
        )
        # Uuids of tasks whose execute request expired before any worker was
        # known: nothing ran, so their revert needs no worker.
        self._never_dispatched: set[str] = set()

    @property
    def book(self) -> tr.RequestBook:
        """The requests it keeps an eye on."""
        return self._book

    def wake(self) -> None:
        """Look at the deadlines again now (one was added or moved earlier)."""
        self._wake.set()

    def arm(self) -> None:
        """Get ready for run() (again, after a stop())."""
        self._stopping.clear()
        self._wake.clear()

    def stop(self) -> None:
        """End run() promptly."""
        self._stopping.set()
        self._wake.set()

    def never_dispatched(self, task_uuid: str) -> bool:
        """True (once) when ``task_uuid``'s execute request expired before any dispatch."""
        try:
            self._never_dispatched.remove(task_uuid)
        except KeyError:
            return False
        return True

    def consumer_ticked(self) -> None:
        """The reply consumer went round its loop (replies read so far are handled)."""
        self._consumer_tick = time.monotonic()

    def consumer_started(self, reconnects: int, outage_s: float | None) -> None:
        """The reply consumer (re)started consuming: forgive the silence of its outage.

        While our consumer was disconnected we could hear nobody, so the
        time our held requests went unheard is not their workers' fault:
        every held request's silence clock restarts now. Without this, an
        outage longer than the loss bound would make us dispatch again
        requests whose workers are alive and still running them, because
        their heartbeats resume a moment after we do. First start (no
        reconnection yet): nothing to forgive. ``reconnects``: how many times
        the consumer reconnected so far; ``outage_s``: the last outage's length.
        """
        if reconnects == self._reconnects_seen:
            return
        self._reconnects_seen = reconnects
        forgiven = self._book.forgive(time.monotonic())
        if forgiven:
            outage = outage_s
            LOG.info(
                "Executor %s hears replies again after %s without a broker connection;"
                " the silence clock of %d held request(s) restarts now (their workers"
                " could not be heard meanwhile)",
                self._uuid,
                "an outage" if outage is None else f"{outage:.1f} s",
                forgiven,
            )
            self._wake.set()  # the scanner picks up the later deadlines

    def run(self) -> None:
        """Expire requests, recover lost ones, refresh discovery, forget silent workers."""
        while not self._stopping.is_set():
            sleep_s = HOUSEKEEPING_MAX_SLEEP_S
            try:
                now = time.monotonic()
                expired, lost, overrun = self._book.scan(now)
                for tracked in expired:
                    if tracked.routing_key is None:
                        # Never published: its revert needs no worker (revert_task).
                        self._never_dispatched.add(tracked.uuid)
                    error = self._timeout_error(tracked)
                    # The engine raises it to its caller: a log line at
                    # WARNING would say the same thing twice.
                    LOG.info("%s", error)
                    self._requests.fail(tracked, error, log=False)
                for tracked in overrun:
                    self._requests.fail(
                        tracked,
                        exc.RequestTimeout(
                            f"Request {_describe(tracked.request)} ran on worker"
                            f" {tracked.worker_id} for longer than its run_timeout of"
                            f" {self._policy.run_timeout} s; it is failed (the worker may still"
                            f" finish it; its reply is ignored)"
                        ),
                    )
                for tracked in lost:
                    self._recover_lost(tracked, now)
                next_deadline = self._book.next_deadline
                if next_deadline is not None:
                    sleep_s = min(sleep_s, max(0.0, next_deadline - time.monotonic()))
                warn_in = self._unserved.check(self._book.waiting(), now)
                if warn_in is not None:
                    sleep_s = min(sleep_s, warn_in)
                self._finder.clean()
                self._finder.maybe_publish()
                beat = self._finder.seconds_to_next_beat()
                if beat is not None:
                    sleep_s = min(sleep_s, beat)
                self._book.scanner_wakes_at(time.monotonic() + sleep_s)
            except Exception:
                LOG.warning(
                    "Housekeeping of executor %s failed; retrying", self._uuid, exc_info=True
                )
            self._wake.wait(sleep_s)
            self._wake.clear()

    def _timeout_error(self, tracked: tr.Tracked) -> exc.RequestTimeout:
        """RequestTimeout with a message saying what it means for the user."""
        waited = self._policy.transition_timeout or 0.0
        where = (
            self._unserved.describe(discovery.task_class_name(tracked.request.task))
            if tracked.routing_key is None
            else f"it was sent to {tracked.routing_key!r}"
            f" {_times(tracked.attempt + 1)} and no worker started it"
        )
        return exc.RequestTimeout(
            f"Request {_describe(tracked.request)} has expired after waiting for {waited:0.2f}"
            f" seconds for it to transition out of ({', '.join(tr.TIMEOUT_STATES)})"
            f" states: {where}"
        )

    def _recover_lost(self, tracked: tr.Tracked, now: float) -> None:
        """A held request's worker went silent: dispatch it again elsewhere, or give up.

        The silent worker is forgotten first, so the next attempt goes to
        another capable worker (it is learned again if it speaks up).
        """
        worker_id = tracked.worker_id
        declined_by = tracked.declined_by
        silent = now - (tracked.last_heard or now)
        route = None
        with self._book.lock:
            request = tracked.request
            if (
                not self._book.is_current(tracked)
                or request.current_state not in (pr.PENDING, pr.RUNNING)
                or tracked.last_heard is None
                or tracked.lost_after is None
                or tracked.last_heard + tracked.lost_after > now
            ):
                return  # finished, or heard from (or forgiven) again meanwhile
            if self._consumer_tick < tracked.last_heard + tracked.lost_after:
                # Our consumer has not caught up since the deadline: look again
                # once it has (its replies may be waiting for us, not lost).
                self._book.recheck(now + CONSUMER_TICK_S)
                return
            # Forgotten before the next route is picked (lock order: book,
            # then finder, as everywhere): the next attempt goes elsewhere.
            if worker_id is not None and self._finder.forget_worker(worker_id):
                LOG.warning(
                    "Forgot worker %s: no heartbeat for %.1f s while holding request %s",
                    worker_id,
                    silent,
                    request,
                )
            allowed = tracked.lost_after
            if declined_by is None:  # a handed-back redelivery lost no worker
                self.lost_history.append(
                    LostRecord(tracked.uuid, worker_id, tracked.attempt, silent, now)
                )
            give_up = self._policy.is_last_attempt(tracked.attempt)
            if give_up:
                if tr.transition(tracked, pr.FAILURE):
                    self._book.remove(tracked)
                else:
                    return
            else:
                route, _ = self._book.new_attempt(tracked)
        if give_up:
            why = (
                f"worker {worker_id} stopped answering ({silent:.1f} s without a"
                f" heartbeat, allowed {allowed:.1f} s)"
                if declined_by is None
                else f"it came back from the broker to worker {declined_by}, which handed it"
                f" back unrun, and nobody held it"
            )
            self._requests.fail(
                tracked,
                exc.RequestLost(
                    f"Request '{request}' was lost: {why}"
                    f" and the request was already dispatched {tracked.attempt + 1} time(s)"
                    f" (max_attempts={self._policy.max_attempts}); its task may or may not have"
                    f" run"
                ),
            )
            return
        if declined_by is not None:
            LOG.warning(
                "Request %s came back from the broker to worker %s, which handed it"
                " back unrun, and no worker said it holds it for %.1f s; dispatching"
                " it again as attempt %d (dispatch %d of at most %d)",
                request,
                declined_by,
                silent,
                tracked.attempt,
                tracked.attempt + 1,
                self._policy.max_attempts,
            )
        else:
            LOG.warning(
                "Request %s was lost with worker %s (%.1f s without a heartbeat,"
                " allowed %.1f s); dispatching it again as attempt %d (dispatch %d of"
                " at most %d)",
                request,
                worker_id,
                silent,
                allowed,
                tracked.attempt,
                tracked.attempt + 1,
                self._policy.max_attempts,
            )
        if route is not None:
            self._requests.publish(tracked)


def _describe(request: Request) -> str:
    """A request as an error names it: uuid, action and task (its state changes under us)."""
    name = getattr(request.task, "name", request.task)
    return f"{request.uuid} ({request.action} of {name!r})"


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"
