"""The conductor loop shared by the blocking and nonblocking conductors (TaskFlow's).

Claims jobs from the board and runs each on an executor (inline for the
blocking conductor, a thread pool for the nonblocking one), then finishes
it. Idle, it blocks on the board's wake-up (a post, a release, a lease
that is due to run out) instead of sleeping and re-listing; on a board
without one it falls back to TaskFlow's ``wait_timeout`` pause.

How a job is finished (see :mod:`.outcomes`): a flow that ran to SUCCESS
is consumed as *succeeded*, one that failed and reverted as *reverted*, one
whose engine failed otherwise as *failed* (TaskFlow consumes these too); a
run cut short by an ExecutionFailure or StorageFailure (usually transient)
is abandoned as a *failed attempt*, so the board backs off and, after the
last attempt, dead-letters it; a job whose flow cannot even be loaded is
trashed. A job whose lease was lost is left alone: someone else owns it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import futurist

from flowengine import exceptions as excp
from flowengine.conductors import base
from flowengine.conductors.backends import outcomes, walk
from flowengine.jobs import records
from flowengine.listeners import claims as claims_listener
from flowengine.listeners import logging as logging_listener
from flowengine.types import timing as tt

__all__ = ["ExecutorConductor"]

LOG = logging.getLogger(__name__)

#: Wake a little after a lease or back-off is due, so the claim finds it over.
DEADLINE_SLACK_S = 0.05
#: After losing a claim race, look again this soon (or at the next event):
#: the listing then shows the winner's lease. Not at once: a row locked by a
#: claimer that is paused mid-transaction would make that a busy loop.
RACE_RETRY_S = 0.2
#: Pause after a board failure while listing/claiming (its server is down):
#: short, since the event thread reports when it is back.
BOARD_FAILURE_PAUSE_S = 0.5
#: After the last sign of another claimer on the board (a lost race, a job
#: claimed or consumed by someone else), keep spreading claims for this long
#: (see :mod:`.walk`); a conductor alone goes back to strict order after it.
RIVALS_MEMORY_S = 10.0

#: What one claim attempt came to.
CLAIMED, HELD, GONE, SKIPPED = "claimed", "held", "gone", "skipped"


class ExecutorConductor(base.Conductor):
    """Dispatches claimed jobs to an executor; see the module docstring."""

    #: Logger used for listening to engines (None: this module's).
    LOG: logging.Logger | None = None
    #: Seconds between full re-listings even without any event: a safety net
    #: for an event lost outside a reconnection (they report RESYNC).
    REFRESH_PERIODICITY = 30.0
    #: TaskFlow's idle pause, only used on boards that cannot wake us.
    WAIT_TIMEOUT = 0.5
    #: Jobs in progress at once (<= 0: no limit).
    MAX_SIMULTANEOUS_JOBS = -1
    #: Engine failures that abandon the job (a failed attempt) instead of consuming it.
    NO_CONSUME_EXCEPTIONS: tuple[type[Exception], ...] = (
        excp.ExecutionFailure,
        excp.StorageFailure,
    )
    #: Events emitted on ``notifier`` (TaskFlow's, then flowengine's).
    EVENTS_EMITTED = (
        "compilation_start",
        "compilation_end",
        "preparation_start",
        "preparation_end",
        "validation_start",
        "validation_end",
        "running_start",
        "running_end",
        "job_consumed",
        "job_abandoned",
        "job_trashed",
        "job_claimed",
        "job_lost",
        "job_dead",
    )
    _event_factory: Callable[[], threading.Event] = threading.Event

    def __init__(
        self,
        name: str,
        jobboard: Any,
        persistence: Any = None,
        engine: Any = None,
        engine_options: dict[str, Any] | None = None,
        wait_timeout: Any = None,
        log: logging.Logger | None = None,
        max_simultaneous_jobs: int | None = MAX_SIMULTANEOUS_JOBS,
        allow_job_engine_options: bool = True,
    ) -> None:
        super().__init__(
            name,
            jobboard,
            persistence=persistence,
            engine=engine,
            engine_options=engine_options,
            allow_job_engine_options=allow_job_engine_options,
        )
        self._wait_timeout = tt.convert_to_timeout(
            value=wait_timeout, default_value=self.WAIT_TIMEOUT, event_factory=self._event_factory
        )
        self._dead = self._event_factory()
        self._dead.set()
        self._log = log or self.LOG or LOG
        self._max_simultaneous_jobs = int(
            max_simultaneous_jobs
            if max_simultaneous_jobs is not None
            else self.MAX_SIMULTANEOUS_JOBS
        )
        self._running: dict[str, outcomes.Running] = {}
        self._running_lock = threading.Lock()
        self._finisher = outcomes.Finisher(self)
        # Each conductor draws its own starting points (see walk.py).
        self._rng = random.Random()
        self._rivals_seen_at = float("-inf")  # time.monotonic() of the last sign
        #: Claim attempts that found the job held or gone (observability, tests).
        self.claims_lost = 0

    def _executor_factory(self) -> Any:
        raise excp.NotImplementedError("This method must be implemented but it has not been")

    @property
    def dispatching(self) -> bool:
        """Whether run() is still dispatching."""
        return not self._dead.is_set()

    @property
    def _leased_board(self) -> bool:
        return hasattr(self._jobboard, "wait_for_change")

    def stop(self) -> None:
        """Stop claiming, and abandon every job in progress at once.

        Each engine is suspended (its running atoms finish; a write they make
        after another conductor claimed the job is refused by the fence) and
        its job goes back on the board now, so others take it without waiting
        for a lease to run out. Returns without waiting: see wait().
        """
        self._wait_timeout.interrupt()
        with self._running_lock:
            running = list(self._running.values())
        for run in running:
            self._finisher.release_on_stop(run)
        if self._leased_board:
            self._jobboard.wake()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for run() to end: True, or False after ``timeout`` seconds."""
        return self._dead.wait(timeout)

    def _listeners_from_job(self, job: Any, engine: Any) -> list[Any]:
        listeners = super()._listeners_from_job(job, engine)
        listeners.append(logging_listener.LoggingListener(engine, log=self._log))
        if not hasattr(self._jobboard, "on_claim_lost"):
            # A board without a lease keeper: check the claim on each change.
            listeners.append(
                claims_listener.CheckingClaimListener(engine, job, self._jobboard, self._name)
            )
        return listeners

    def _dispatch_job(self, job: Any) -> bool:
        """Run ``job``'s flow; True to consume it (its decision is kept for finishing)."""
        run = self._running_entry(job)
        decision = outcomes.run_job(self, run)
        run.decision = decision
        return decision.action == outcomes.CONSUME

    def _running_entry(self, job: Any) -> outcomes.Running:
        with self._running_lock:
            run = self._running.get(job.uuid)
            if run is None:
                run = self._running[job.uuid] = outcomes.Running(job)
        return run

    def _try_finish_job(self, job: Any, consume: bool, trash: bool = False) -> None:
        """Consume, trash or abandon ``job`` (TaskFlow's hook; retried while the board is down)."""
        run = self._running_entry(job)
        if run.decision is None:
            run.decision = outcomes.Decision(
                outcomes.CONSUME if consume else (outcomes.TRASH if trash else outcomes.FAIL),
                records.SUCCEEDED if consume else None,
            )
        self._finisher.finish(run)

    def _on_job_done(self, job: Any, fut: Any) -> None:
        run = self._running_entry(job)
        try:
            consume = fut.result()
        except KeyboardInterrupt:
            self._log.warning("Job dispatching interrupted: %s", job)
            raise
        except Exception as e:
            self._log.warning("Job dispatching failed: %s", job, exc_info=True)
            run.decision = outcomes.Decision(
                outcomes.TRASH, records.TRASHED, f"{type(e).__name__}: {e}"
            )
            consume = False
        try:
            self._try_finish_job(
                job,
                consume,
                trash=run.decision is not None and run.decision.action == outcomes.TRASH,
            )
        finally:
            with self._running_lock:
                self._running.pop(job.uuid, None)
            if self._leased_board:
                self._jobboard.wake()  # capacity freed: look for more work

    def _can_claim_more_jobs(self, job: Any = None) -> bool:
        if self._wait_timeout.is_stopped():
            return False
        if self._max_simultaneous_jobs <= 0:
            return True
        with self._running_lock:
            return len(self._running) < self._max_simultaneous_jobs

    def _candidates(self) -> tuple[list[Any], float | None]:
        """Claimable jobs in order, and when (epoch s) the next non-claimable one may become so."""
        if not self._leased_board:
            return list(self._jobboard.iterjobs()), None
        now = time.time()
        held = {j.uuid for j in self._jobboard.held_jobs()}
        with self._running_lock:
            running = set(self._running)
        ready, due = [], None
        for job in self._jobboard.listing():
            if job.uuid in running:
                # Still running here though its lease lapsed (a partition, a
                # pause): claiming it again would run it twice in this process.
                continue
            rec = job.record
            when = rec.lease_expires_at if rec.leased else rec.not_before
            if rec.leased and job.uuid not in held:
                self._saw_rivals()  # another claimer works this board
            if rec.leased or (rec.not_before is not None and rec.not_before > now):
                if when is not None and job.uuid not in held:
                    due = when if due is None else min(due, when)
                continue
            ready.append(job)
        return ready, due

    def _saw_rivals(self) -> None:
        self._rivals_seen_at = time.monotonic()

    def _walk(self, ready: list[Any]) -> walk.ClaimWalk:
        """The order to try ``ready`` in: spread out while other claimers are about."""
        rivals = time.monotonic() - self._rivals_seen_at < RIVALS_MEMORY_S
        return walk.ClaimWalk(ready, spread=rivals, rng=self._rng)

    def _taken_meanwhile(self, job: Any) -> bool:
        """Whether the board heard that someone claimed or finished ``job`` since listing it."""
        taken = getattr(self._jobboard, "taken_since_listed", None)
        return taken is not None and bool(taken(job))

    def _idle(self, seen: int, due: float | None) -> None:
        if not self._leased_board:
            self._wait_timeout.wait()
            return
        timeout = self.REFRESH_PERIODICITY
        if due is not None:
            timeout = min(timeout, max(0.0, due - time.time()) + DEADLINE_SLACK_S)
        self._jobboard.wait_for_change(seen, timeout)

    def _claim_and_submit(self, executor: Any, job: Any) -> str:
        """CLAIMED (dispatched), HELD (another claimer has it), GONE (finished) or SKIPPED."""
        self._log.debug("Trying to claim job: %s", job)
        try:
            self._jobboard.claim(job, self._name)
        except excp.UnclaimableJob as e:
            self._log.debug("Job not claimable (%s): %s", e, job)
            # Held by another claimer: list again to learn when its lease is
            # due. Backing off or dead-lettered: the next listing shows it.
            return HELD if getattr(e, "held_by", None) else SKIPPED
        except excp.NotFound:
            self._log.debug("Job already consumed: %s", job)
            return GONE
        run = self._running_entry(job)
        self._notifier.notify("job_claimed", {"job": job, "conductor": self})
        if hasattr(self._jobboard, "on_claim_lost"):
            self._jobboard.on_claim_lost(job, functools.partial(self._finisher.on_lost, run))
        try:
            fut = executor.submit(self._dispatch_job, job)
        except RuntimeError:
            self._log.warning("Job dispatch submitting failed: %s", job)
            run.decision = outcomes.Decision(outcomes.ABANDON)
            self._finisher.finish(run)
            with self._running_lock:
                self._running.pop(job.uuid, None)
            raise
        fut.add_done_callback(functools.partial(self._on_job_done, job))
        return CLAIMED

    def _chains_claims(self, executor: Any) -> bool:
        """Whether to claim the next job with the consume of the current one (see below)."""
        return isinstance(executor, futurist.SynchronousExecutor) and hasattr(
            self._jobboard, "claim_with_next_consume"
        )

    def _claim_next_with_consume(self, order: walk.ClaimWalk, limit: int, dispatched: int) -> None:
        """Ask the board to claim the walk's next job with the consume of the one about to run.

        Only for a conductor that runs one job at a time inline (blocking):
        the job's consume happens before the walk goes on, and the next job
        it takes is known. Where the board can (ZooKeeper), one write then
        serves both; a claim made so is handed over by the next claim() and
        given back by _drop_next_claim() if the walk ends first.
        """
        then = order.peek()
        if then is not None and (0 <= limit <= dispatched + 1 or self._taken_meanwhile(then)):
            then = None
        self._jobboard.claim_with_next_consume(then, self._name)

    def _drop_next_claim(self, chain: bool) -> None:
        if chain:
            try:
                self._jobboard.drop_next_claim(self._name)
            except excp.JobFailure:
                self._log.warning("Could not give back a job claimed ahead", exc_info=True)

    def _run_until_dead(self, executor: Any, max_dispatches: int | None = None) -> None:
        limit = -1 if max_dispatches is None else max_dispatches
        dispatched = 0
        is_stopped = self._wait_timeout.is_stopped
        while not is_stopped() and (limit < 0 or dispatched < limit):
            seen = self._jobboard.change_seq if self._leased_board else 0
            any_dispatched = lost_race = False
            due = None
            chain = self._chains_claims(executor)
            try:
                ready, due = self._candidates()
                order = self._walk(ready)
                for job in order:
                    if not self._can_claim_more_jobs(job) or 0 <= limit <= dispatched:
                        break
                    if self._taken_meanwhile(job):
                        # Claimed or finished by another since the listing: a
                        # claim would be refused, and whoever works near here
                        # is likely to take the next ones too.
                        self._saw_rivals()
                        order.scatter()
                        lost_race = True
                        continue
                    if chain:
                        self._claim_next_with_consume(order, limit, dispatched)
                    claimed = self._claim_and_submit(executor, job)
                    if claimed == CLAIMED:
                        any_dispatched = True
                        dispatched += 1
                    elif claimed in (HELD, GONE):
                        self.claims_lost += 1
                        self._saw_rivals()
                        order.scatter()
                        # Held: list again soon to learn when its lease is due.
                        lost_race = lost_race or claimed == HELD
            except excp.JobFailure:
                self._log.warning(
                    "Job board failure while looking for jobs; retrying", exc_info=True
                )
                self._drop_next_claim(chain)
                if self._leased_board:
                    self._jobboard.wait_for_change(seen, BOARD_FAILURE_PAUSE_S)
                else:
                    self._wait_timeout.wait()
                continue
            self._drop_next_claim(chain)
            if lost_race:
                due = min(due or float("inf"), time.time() + RACE_RETRY_S)
            if not any_dispatched and not is_stopped():
                self._idle(seen, due)
        if 0 <= limit <= dispatched:
            self._log.info("Maximum dispatch limit of %s reached", limit)

    def run(self, max_dispatches: int | None = None) -> None:
        """Claim, run and finish jobs until stop() (or ``max_dispatches`` dispatched).

        Returns once the jobs it dispatched are finished.
        """
        self._dead.clear()
        self._wait_timeout.reset()
        try:
            self._jobboard.register_entity(self.conductor)
            with contextlib.ExitStack() as stack:
                executor = stack.enter_context(self._executor_factory())
                try:
                    self._run_until_dead(executor, max_dispatches=max_dispatches)
                finally:
                    # Nothing claimed ahead outlives the loop (see _claim_next_with_consume).
                    self._drop_next_claim(self._chains_claims(executor))
        finally:
            self._dead.set()
