"""Running one claimed job and finishing it: the decisions of :mod:`.impl_executor`.

``run_job`` loads the job's engine, runs its stages (emitting TaskFlow's
``*_start``/``*_end`` events) and turns what happened into a
:class:`Decision`; :class:`Finisher` carries the decision out on the board
(retrying while the board's server is unreachable), and handles the two
ways a job ends early: the conductor is stopped, or its lease is lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flowengine import exceptions as excp
from flowengine import states
from flowengine.jobs import records

__all__ = [
    "ABANDON",
    "CONSUME",
    "FAIL",
    "NOTHING",
    "TRASH",
    "Decision",
    "Finisher",
    "Running",
    "run_job",
]

LOG = logging.getLogger(__name__)

CONSUME, TRASH, FAIL, ABANDON, NOTHING = "consume", "trash", "fail", "abandon", "nothing"

#: How long a conductor keeps trying to consume/abandon a finished job while
#: the board's server is unreachable (a restart, a failover). Its lease is
#: renewed again as soon as the server is back, so two minutes of retrying
#: beat re-running a finished flow elsewhere.
FINISH_RETRY_S = 120.0
#: Pause between two such tries.
FINISH_RETRY_PAUSE_S = 0.5

_FLOW_OUTCOME = {states.SUCCESS: records.SUCCEEDED, states.REVERTED: records.REVERTED}


@dataclass
class Decision:
    """What to do with a job once its engine stopped."""

    action: str
    outcome: str | None = None
    reason: str | None = None
    #: The job is someone else's now (a write was fenced out, or the lease was lost).
    lost: bool = False


@dataclass
class Running:
    """A job this conductor claimed, while it is in progress."""

    job: Any
    engine: Any = None
    decision: Decision | None = None
    released: bool = False
    lost: bool = False
    #: The engine's run ended (returned or raised): a stop from then on no
    #: longer gives the job back; the decision taken from its end is applied.
    ended: bool = False
    #: finish() started carrying out the decision; it returned.
    finishing: bool = False
    finished: bool = False
    #: The board carried out the decision: the job is no longer ours to lose.
    settled: bool = False
    lost_reported: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def given_up(self) -> bool:
        """True once the job was released (stop) or its claim lost (set by other threads)."""
        return self.released or self.lost

    def mark_ended(self) -> None:
        """The engine stopped running: from now on a stop lets the job finish as decided."""
        with self.lock:
            self.ended = True


def _suspend(engine: Any, job: Any, why: str) -> None:
    if engine is None:
        return
    try:
        engine.suspend()
    except excp.FencedOut:
        LOG.debug("Suspending the engine of job %s: its state write was fenced out", job.uuid)
    except Exception:
        LOG.warning("Failed suspending the engine of job %s (%s)", job.uuid, why, exc_info=True)


def _consume(engine: Any, reason: str | None = None) -> Decision:
    state = engine.storage.get_flow_state()
    return Decision(CONSUME, _FLOW_OUTCOME.get(state, records.FAILED), reason)


def reason_of(error: BaseException) -> str:
    """Why a job's flow failed, worded alike whichever engine ran it.

    A parallel engine raises one WrappedFailure for several failed tasks where
    a serial one re-raises the task's own exception: both read
    ``RuntimeError: boom`` (several failures joined by ``; ``).
    """
    if isinstance(error, excp.WrappedFailure):
        return "; ".join(f"{next(iter(f), 'Exception')}: {f.exception_str}" for f in error)
    return f"{type(error).__name__}: {error}"


def run_job(conductor: Any, run: Running) -> Decision:
    """Run the job's flow to its end; the Decision on how to finish it.

    Exceptions from loading the engine (no flow detail, factory missing)
    propagate: TaskFlow trashes such jobs. A StorageFailure while loading
    it fails the attempt instead: the job is tried again.
    """
    job, log = run.job, conductor._log
    if job.lost.is_set() if hasattr(job, "lost") else False:
        return Decision(NOTHING, reason="lease lost before the job started")
    try:
        engine = conductor._engine_from_job(job)
    except excp.FencedOut as e:
        return Decision(NOTHING, reason=str(e), lost=True)
    except excp.StorageFailure as e:
        # The persistence could not be reached or written (an ensemble's
        # leader lost for longer than a reconnection, a database failover):
        # the job is sound, so it fails this attempt and is tried again
        # after its back-off, where TaskFlow would trash it.
        log.warning("Job %s could not load its flow (%s): given back as a failed attempt", job, e)
        return Decision(FAIL, reason=reason_of(e))
    with run.lock:
        run.engine = engine
        if run.given_up():
            return Decision(NOTHING, reason="released before the engine started")
    details = {"job": job, "engine": engine, "conductor": conductor}
    no_consume = conductor.NO_CONSUME_EXCEPTIONS
    with contextlib.ExitStack() as stack:
        for listener in conductor._listeners_from_job(job, engine):
            stack.enter_context(listener)
        log.debug("Dispatching engine for job '%s'", job)
        try:
            try:
                for stage, name in (
                    (engine.compile, "compilation"),
                    (engine.prepare, "preparation"),
                    (engine.validate, "validation"),
                    (engine.run, "running"),
                ):
                    conductor.notifier.notify(f"{name}_start", details)
                    try:
                        stage()
                    finally:
                        if name == "running":
                            # Before running_end: a listener stopping the
                            # conductor there must not give back a finished job.
                            run.mark_ended()
                    conductor.notifier.notify(f"{name}_end", details)
            finally:
                run.mark_ended()
        except excp.WrappedFailure as e:
            if run.given_up():
                return Decision(NOTHING, reason=reason_of(e))
            if all(f.check(*no_consume) for f in e):
                log.warning(
                    "Job execution failed (consumption being skipped): %s [%s failures]",
                    job,
                    len(e),
                )
                return Decision(FAIL, reason=reason_of(e))
            log.warning(
                "Job execution failed (consumption proceeding): %s [%s failures]", job, len(e)
            )
            return _consume(engine, reason_of(e))
        except no_consume as e:
            if run.given_up() or isinstance(e, excp.FencedOut):
                return Decision(
                    NOTHING, reason=reason_of(e), lost=run.lost or isinstance(e, excp.FencedOut)
                )
            log.warning("Job execution failed (consumption being skipped): %s", job, exc_info=True)
            return Decision(FAIL, reason=reason_of(e))
        except Exception as e:
            if run.given_up():
                return Decision(NOTHING, reason=reason_of(e))
            log.warning("Job execution failed (consumption proceeding): %s", job, exc_info=True)
            return _consume(engine, reason_of(e))
    if engine.storage.get_flow_state() == states.SUSPENDED:
        log.info("Job execution was suspended: %s", job)
        return Decision(NOTHING if run.given_up() else ABANDON)
    log.info("Job completed successfully: %s", job)
    return _consume(engine)


class Finisher:
    """Carries out decisions on the conductor's board and emits the job_* events."""

    def __init__(self, conductor: Any) -> None:
        self._conductor = conductor

    def _notify(self, event: str, job: Any) -> None:
        c = self._conductor
        c.notifier.notify(event, {"job": job, "conductor": c, "persistence": c._persistence})

    def _apply(self, job: Any, decision: Decision) -> None:
        try:
            done = self._send(job, decision)
        except (excp.NotFound, excp.ClaimLost):
            done = self._applied_before(job)
            if done is None:
                raise
        if decision.action == CONSUME:
            self._notify("job_consumed", job)
        elif decision.action == TRASH:
            self._notify("job_trashed", job)
        else:
            self._notify("job_abandoned", job)
            if isinstance(done, records.Outcome) and done.outcome == records.DEAD:
                self._conductor._log.warning(
                    "Job %s failed its last attempt: moved to the dead letter", job
                )
                self._notify("job_dead", job)

    def _send(self, job: Any, decision: Decision) -> records.Outcome | None:
        """Ask the board to finish ``job`` as ``decision`` says; the outcome it returns."""
        c = self._conductor
        board, who = c._jobboard, c._name
        extended = hasattr(board, "wait_for_change")  # flowengine's board: outcomes, attempts
        if not extended:  # TaskFlow's board API: no outcome, reason nor failed attempts
            {CONSUME: board.consume, TRASH: board.trash}.get(decision.action, board.abandon)(
                job, who
            )
            return None
        if decision.action == CONSUME:
            outcome = decision.outcome or records.SUCCEEDED
            board.consume(job, who, outcome=outcome, reason=decision.reason)
            return None
        if decision.action == TRASH:
            board.trash(job, who, reason=decision.reason)
            return None
        done: records.Outcome | None = board.abandon(
            job, who, failed=decision.action == FAIL, reason=decision.reason
        )
        return done

    def _applied_before(self, job: Any) -> records.Outcome | None:
        """The outcome this conductor's claim already gave ``job``, if it did (else None).

        A board server that fails over (or a connection that drops) after
        applying a finish but before answering makes the finish be sent
        again; the job is gone by then, so the board answers NotFound or
        ClaimLost. The outcome it kept tells the two apart: ours if it was
        recorded by this conductor under this very claim (its fencing
        token), which no other finish can share.
        """
        board, token = self._conductor._jobboard, getattr(job, "token", 0)
        if not token or not hasattr(board, "outcome"):
            return None
        try:
            done: records.Outcome | None = board.outcome(job)
        except excp.JobFailure:
            return None
        if done is None or done.who != self._conductor._name or done.token != token:
            return None
        self._conductor._log.info(
            "Job %s was already %s by this conductor (a finish sent again after its"
            " answer was lost)",
            job,
            done.outcome,
        )
        return done

    def finish(self, run: Running) -> None:
        """Carry out ``run.decision`` (nothing if the job was released or lost)."""
        with run.lock:
            if run.released or run.finishing:
                return
            run.finishing = True
        settled = self._carry_out(run, run.decision or Decision(ABANDON))
        with run.lock:
            run.finished, run.settled = True, settled
            lost = run.lost and not settled
        if lost:
            self._report_lost(run)

    def _carry_out(self, run: Running, decision: Decision) -> bool:
        """Finish the job on the board as ``decision`` says; True once the board did.

        A loss met here is told by setting ``run.lost``; the caller reports it.
        """
        job, log = run.job, self._conductor._log
        if decision.action == NOTHING or run.lost:
            log.info("Job %s left alone (%s)", job, decision.reason or "not ours any more")
            if decision.lost:
                with run.lock:
                    run.lost = True
            return False
        deadline = time.monotonic() + FINISH_RETRY_S
        while True:
            try:
                self._apply(job, decision)
                return True
            except excp.BoardUnavailable as e:
                # Tried again even when the keeper found the claim lost
                # meanwhile: that may be this very finish, applied by a
                # server that could not answer (see _applied_before).
                if time.monotonic() > deadline:
                    log.warning(
                        "Gave up finishing job %s (%s) after %.0f s: its lease runs"
                        " out and another conductor resumes it",
                        job,
                        e,
                        FINISH_RETRY_S,
                    )
                    return False
                time.sleep(FINISH_RETRY_PAUSE_S)
            except excp.ClaimLost as e:
                log.warning("Job %s was not %s: %s", job, decision.action, e)
                with run.lock:
                    run.lost = True
                return False
            except (excp.JobFailure, excp.NotFound):
                log.warning("Failed job %s: %s", decision.action, job, exc_info=True)
                return False

    def release_on_stop(self, run: Running) -> None:
        """Stop: suspend the job's engine and give the job back now (not a failed attempt).

        Only while its engine may still be running: once the engine's run
        ended, the job is finished as that end decides (TaskFlow consumes a
        flow that succeeded even when the conductor was stopped meanwhile).
        """
        with run.lock:
            if run.released or run.finishing or run.decision is not None or run.lost or run.ended:
                return
            run.released = True
            engine = run.engine
        _suspend(engine, run.job, "conductor stopping")
        c = self._conductor
        try:
            c._jobboard.abandon(run.job, c._name)
            self._notify("job_abandoned", run.job)
        except (excp.JobFailure, excp.NotFound) as e:
            c._log.warning(
                "Could not abandon job %s while stopping (%s); its lease runs out instead",
                run.job,
                e,
            )

    def _report_lost(self, run: Running) -> None:
        with run.lock:
            if run.lost_reported:
                return
            run.lost_reported = True
        self._notify("job_lost", run.job)

    def on_lost(self, run: Running, job: Any = None) -> None:
        """The keeper found the lease gone: suspend the engine at once.

        While the job is being finished, finish() tells a loss itself: the
        lease the keeper missed may be gone because that finish landed.
        """
        with run.lock:
            run.lost = True
            engine, finished = run.engine, run.finished
            being_finished = run.settled or (run.finishing and not finished)
        if being_finished:
            self._conductor._log.info("Job %s: its lease ended as it was finished", run.job)
            return
        self._conductor._log.warning("Lost the claim on job %s: suspending its engine", run.job)
        _suspend(engine, run.job, "claim lost")
        if finished:  # its engine already stopped: nothing else will say so
            self._report_lost(run)
