"""How a worker runs the requests it took: on its pool, one thread each, answering each.

The consume loop (:mod:`.intake`) hands every request it takes to the
:class:`Performer`, which submits it to the worker's pool. On a pool thread
the request is started (RUNNING), its body run under its time limits
(:mod:`.runner`) with progress forwarded as EVENT replies, and its outcome
sent; a request that waited for a thread past its ``expires`` is dropped
unrun instead. Whatever happens, the request is no longer held afterwards.

What else hears of each request (the worker's activity for ``inspect``,
cancellation, metrics, the exception-handler chain) is one
:class:`RequestHooks` object; without one a failure is logged at WARNING
(:func:`.exception_handlers.log_failure`).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Protocol

from flowengine import exceptions as exc
from flowengine import task as task_mod
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.events.hooks import WorkerEvents
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.wire.peer_clock import PeerClocks
from flowengine.engines.worker_based.worker_side import context as context_mod
from flowengine.engines.worker_based.worker_side import exception_handlers
from flowengine.engines.worker_based.worker_side import held as rm
from flowengine.engines.worker_based.worker_side.endpoint import Endpoint
from flowengine.engines.worker_based.worker_side.replier import Replier, SentOutcome
from flowengine.engines.worker_based.worker_side.runner import TaskRunner
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Job:
    """A request taken by the worker, ready for a pool thread."""

    endpoint: Endpoint
    task: task_mod.BaseTask
    work: pr.WorkUnit
    key: rm.Key
    headers: Headers

    @property
    def task_uuid(self) -> str:
        """The request's (task's) uuid."""
        return self.key[0]


class RequestHooks(Protocol):
    """What hears of each request the performer handles (all called on pool threads)."""

    def received(self, job: Job) -> None:
        """``job`` was taken and handed to the pool."""

    def refusal(self, job: Job) -> BaseException | None:
        """Why ``job`` must not start (it was cancelled), or None to run it."""

    def started(self, job: Job) -> threading.Event:
        """``job``'s body starts now; the event is set if it gets cancelled."""

    def failed(self, job: Job, failure: ft.Failure, elapsed_s: float) -> None:
        """``job``'s body failed (after its FAILURE was sent, and after ``finished``)."""

    def finished(self, job: Job, result: Any, elapsed_s: float) -> None:
        """``job``'s body ended (``result`` may be a Failure); before its event and outcome."""

    def done(self, job: Job) -> None:
        """``job`` is no longer held: right after ``finished``, and again last whatever
        happened (so it must be idempotent)."""


class Performer:
    """Runs taken requests on ``pool`` and sends their replies (RUNNING, EVENT, outcome).

    ``memory`` holds each request until its outcome is sent; ``replier``
    sends the replies; ``events`` hears of each request's life;
    ``task_runner`` runs the bodies; ``worker_id`` names this worker in the
    request context task code can read (:mod:`.context`); ``clocks`` says
    when a request expired by its engine's clock (shared with the intake).
    """

    def __init__(self, pool: cf.Executor, memory: rm.RequestMemory, replier: Replier,
                 events: WorkerEvents, task_runner: TaskRunner, worker_id: str,
                 clocks: PeerClocks | None = None,
                 hooks: RequestHooks | None = None) -> None:
        self._clocks = clocks or PeerClocks()
        self._hooks = hooks
        self._pool = pool
        self._memory = memory
        self._replier = replier
        self._events = events
        self._task_runner = task_runner
        self._worker_id = worker_id

    def submit(self, job: Job) -> None:
        """Hand ``job`` to the pool; raises what the pool raises (e.g. it was shut down)."""
        self._events.received(job.task_uuid, job.work, job.headers)
        if self._hooks is not None:
            self._hooks.received(job)
        try:
            self._pool.submit(self.perform, job)
        except Exception:
            self._events.forget(job.task_uuid)
            if self._hooks is not None:
                self._hooks.done(job)
            raise

    def perform(self, job: Job) -> None:
        """Run one request on this (pool) thread and send its replies; never raises."""
        task_uuid, work = job.task_uuid, job.work
        outcome: SentOutcome | None = None
        try:
            held = self._memory.start(job.key)
            if held is None:
                return
            refusal = None if self._hooks is None else self._hooks.refusal(job)
            if refusal is not None:
                self._replier.answering(held)
                self._replier.reply_failure(held.reply_to, task_uuid, refusal, held.attempt)
                LOG.info("Request %s for task %r dropped unrun: %s", task_uuid,
                         work.task_name, refusal)
                return
            late = (None if held.expires is None
                    else self._clocks.overdue(held.reply_to, held.expires))
            if late is not None:
                # Waited here for a thread past the time its executor gave up.
                self._replier.answering(held)
                self._replier.drop_expired(held.reply_to, task_uuid, work.task_name, late,
                                           job.headers)
                return
            if not self._replier.started(held):
                LOG.error("Request %s for task %r not run: its RUNNING reply could not"
                          " be sent", task_uuid, work.task_name)
                return
            if held.fenced:  # cut off from the broker meanwhile (fence.py): not here
                LOG.warning("Request %s for task %r not started: this worker lost its"
                            " broker before it could", task_uuid, work.task_name)
                return
            self._events.started(task_uuid)
            started = time.monotonic()
            progress = functools.partial(self._replier.forward_event, held)
            cancelled = threading.Event() if self._hooks is None else self._hooks.started(job)
            ctx = context_mod.RequestContext(task_uuid, work.action, held.attempt or 0,
                                             job.key[2], self._worker_id, cancelled)
            with context_mod.running(ctx):
                result = self._task_runner.run(job.endpoint, job.task, work, progress,
                                               job.headers, (task_uuid, work.action))
            elapsed = time.monotonic() - started
            if self._memory.is_fenced(job.key):
                # Stopped (or finished) while cut off from the broker: given
                # back, whatever the body did (see fence.py).
                result = ft.Failure.from_exception(exc.RequestFenced(
                    f"Worker {self._worker_id} lost its broker while running request"
                    f" {task_uuid} ({work.action} of task {work.task_name!r}) and stopped"
                    f" it; dispatch it again"))
            state = pr.FAILURE if isinstance(result, ft.Failure) else pr.SUCCESS
            if self._hooks is not None:
                # Counted and no longer shown as held before anyone hears of its
                # end: whoever asks the worker after the event sees it counted.
                self._hooks.finished(job, result, elapsed)
                self._hooks.done(job)
            # Told before the outcome is sent: an execute and its revert share
            # a uuid, and the revert (sent once the engine has the outcome)
            # must not find the execute still tracked by the events.
            self._events.finished(task_uuid, state == pr.SUCCESS, result)
            outcome = self._replier.send_outcome(held, work, state, result, elapsed)
            self._log_outcome(job, result, elapsed)
        except Exception:
            LOG.exception("Unexpected error running request %s", task_uuid)
        finally:
            if self._hooks is not None:
                try:
                    self._hooks.done(job)
                except Exception:
                    LOG.exception("Request hooks failed for request %s", task_uuid)
            if outcome is None or self._memory.is_fenced(job.key):
                self._memory.forget(job.key)
            else:
                self._memory.finish(job.key, outcome.body, outcome.size)

    def _log_outcome(self, job: Job, result: Any, elapsed: float) -> None:
        work = job.work
        if isinstance(result, ft.Failure):
            if self._hooks is None:
                # The task's own error: the operator reads it here, the engine
                # gets it (traceback included) in the FAILURE reply.
                exception_handlers.log_failure(exception_handlers.FailedRequest.of(
                    job, result, elapsed, self._worker_id))
            else:
                self._hooks.failed(job, result, elapsed)
        else:
            LOG.info("Task %r (%s) %s for request %s finished in %.3f s: %s",
                     work.task_name, work.task_cls, work.action, job.task_uuid, elapsed,
                     pr.SUCCESS)
