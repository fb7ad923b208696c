"""The executor's housekeeping: deadlines, lost requests, grace after its own outage.

Runs beside the request path in a thread of its own (WorkerTaskExecutor
mixes it in): it fails requests nobody started in time or that ran too long,
dispatches again the requests whose worker fell silent, refreshes discovery
and forgets silent workers. Silence only counts while the executor could
hear: see ``_on_consumer_tick`` and ``_on_consumer_start``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import discovery as wt
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side import unserved
from flowengine.engines.worker_based.messaging import proxy as px

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


class LostRecord(collections.namedtuple(
        "LostRecord", "request_uuid worker_id attempt silent_s detected_at")):
    """One request found lost: whose worker, which attempt, after how long a silence."""


class Housekeeping:
    """Expiry, lost-request recovery and discovery upkeep of WorkerTaskExecutor (a mixin).

    Expects the attributes and methods annotated below from the class it is
    mixed into.
    """

    _uuid: str
    _book: tr.RequestBook
    _finder: wt.ProxyWorkerFinder
    _proxy: px.Proxy
    _transition_timeout: float | None
    _max_attempts: int
    _run_timeout: float | None
    _wake: threading.Event
    _stopping: threading.Event
    _consumer_tick: float
    _reconnects_seen: int
    lost_history: collections.deque[LostRecord]
    _unserved: unserved.UnservedWatch
    _never_dispatched: set[str]
    _fail: Callable[..., None]
    _publish_request: Callable[[tr.Tracked], None]

    def _on_consumer_tick(self) -> None:
        """The reply consumer went round its loop (replies read so far are handled)."""
        self._consumer_tick = time.monotonic()

    def _on_consumer_start(self) -> None:
        """The reply consumer (re)started consuming: forgive the silence of its outage.

        While our consumer was disconnected we could hear nobody, so the
        time our held requests went unheard is not their workers' fault:
        every held request's silence clock restarts now. Without this, an
        outage longer than the loss bound would make us dispatch again
        requests whose workers are alive and still running them, because
        their heartbeats resume a moment after we do. First start: nothing
        to forgive.
        """
        reconnects = self._proxy.reconnect_count
        if reconnects == self._reconnects_seen:
            return
        self._reconnects_seen = reconnects
        forgiven = self._book.forgive(time.monotonic())
        if forgiven:
            outage = self._proxy.last_outage_s
            LOG.info("Executor %s hears replies again after %s without a broker connection;"
                     " the silence clock of %d held request(s) restarts now (their workers"
                     " could not be heard meanwhile)", self._uuid,
                     "an outage" if outage is None else f"{outage:.1f} s", forgiven)
            self._wake.set()  # the scanner picks up the later deadlines

    def _housekeeping_loop(self) -> None:
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
                    self._fail(tracked, error, log=False)
                for tracked in overrun:
                    self._fail(tracked, exc.RequestTimeout(
                        f"Request '{tracked.request}' ran on worker {tracked.worker_id} for"
                        f" longer than its run_timeout of {self._run_timeout} s; it is"
                        f" failed (the worker may still finish it; its reply is ignored)"))
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
            except Exception:
                LOG.warning("Housekeeping of executor %s failed; retrying", self._uuid,
                            exc_info=True)
            self._wake.wait(sleep_s)
            self._wake.clear()

    def _timeout_error(self, tracked: tr.Tracked) -> exc.RequestTimeout:
        """RequestTimeout with a message saying what it means for the user."""
        waited = self._transition_timeout or 0.0
        where = (self._unserved.describe(wt.task_class_name(tracked.request.task))
                 if tracked.routing_key is None
                 else f"no worker on {tracked.routing_key!r} started it")
        return exc.RequestTimeout(
            f"Request '{tracked.request}' has expired after waiting for {waited:0.2f}"
            f" seconds for it to transition out of ({', '.join(tr.TIMEOUT_STATES)})"
            f" states: {where}")

    def _recover_lost(self, tracked: tr.Tracked, now: float) -> None:
        """A held request's worker went silent: dispatch it again elsewhere, or give up.

        The silent worker is forgotten first, so the next attempt goes to
        another capable worker (it is learned again if it speaks up).
        """
        worker_id = tracked.worker_id
        silent = now - (tracked.last_heard or now)
        route = None
        with self._book.lock:
            request = tracked.request
            if (not self._book.is_current(tracked)
                    or request.current_state not in (pr.PENDING, pr.RUNNING)
                    or tracked.last_heard is None or tracked.lost_after is None
                    or tracked.last_heard + tracked.lost_after > now):
                return  # finished, or heard from (or forgiven) again meanwhile
            if self._consumer_tick < tracked.last_heard + tracked.lost_after:
                # Our consumer has not caught up since the deadline: look again
                # once it has (its replies may be waiting for us, not lost).
                self._book.recheck(now + CONSUMER_TICK_S)
                return
            # Forgotten before the next route is picked (lock order: book,
            # then finder, as everywhere): the next attempt goes elsewhere.
            if worker_id is not None and self._finder.forget_worker(worker_id):
                LOG.warning("Forgot worker %s: no heartbeat for %.1f s while holding"
                            " request %s", worker_id, silent, request)
            allowed = tracked.lost_after
            self.lost_history.append(LostRecord(tracked.uuid, worker_id, tracked.attempt,
                                                silent, now))
            give_up = tracked.attempt + 1 >= self._max_attempts
            if give_up:
                if tr.transition(tracked, pr.FAILURE):
                    self._book.remove(tracked)
                else:
                    return
            else:
                route, _ = self._book.new_attempt(tracked)
        if give_up:
            self._fail(tracked, exc.RequestLost(
                f"Request '{request}' was lost: worker {worker_id} stopped answering"
                f" ({silent:.1f} s without a heartbeat, allowed {allowed:.1f} s)"
                f" and the request was already dispatched {tracked.attempt + 1} time(s)"
                f" (max_attempts={self._max_attempts}); its task may or may not have run"))
            return
        LOG.warning("Request %s was lost with worker %s (%.1f s without a heartbeat, allowed"
                    " %.1f s); dispatching it again as attempt %d (dispatch %d of at most %d)",
                    request, worker_id, silent, allowed, tracked.attempt,
                    tracked.attempt + 1, self._max_attempts)
        if route is not None:
            self._publish_request(tracked)
