"""How a worker runs the requests it took: on its pool, one thread each, answering each.

The consume loop (:mod:`.intake`) hands every request it takes to the
:class:`Performer`, which submits it to the worker's pool (or runs a short
one taken alone right there, see :mod:`.short_bodies`). On a pool thread
the request is started (RUNNING), its body run under its time limits
(:mod:`.runner`) with progress forwarded as EVENT replies, and its outcome
sent; a request that waited for a thread past its ``expires`` is dropped
unrun instead. Whatever happens, the request is no longer held afterwards.

Whatever else hears of each request or acts on it (events, the worker's
activity for ``inspect`` and cancellation, metrics, tracing, exception
handlers, fencing) is a middleware of the worker's one list, called at the
points :mod:`.middleware` lists, in that order.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import time
from typing import Any

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire.peer_clock import PeerClocks
from flowengine.engines.worker_based.worker_side import context as context_mod
from flowengine.engines.worker_based.worker_side import held as held_mod
from flowengine.engines.worker_based.worker_side.middleware import Job, MiddlewareChain
from flowengine.engines.worker_based.worker_side.replier import Replier, SentOutcome
from flowengine.engines.worker_based.worker_side.runner import TaskRunner
from flowengine.engines.worker_based.worker_side.short_bodies import ShortBodies
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

__all__ = ["Performer"]


class Performer:
    """Runs taken requests on ``pool`` and sends their replies (RUNNING, EVENT, outcome).

    ``memory`` holds each request until its outcome is sent; ``replier``
    sends the replies; ``middleware`` hears of (and may act on) each
    request's life; ``task_runner`` runs the bodies; ``worker_id`` names this
    worker in the request context task code can read (:mod:`.context`);
    ``clocks`` says when a request expired by its engine's clock (shared
    with the intake); ``short_bodies`` (None: every request goes to the
    pool) lets :meth:`submit` run a short request taken alone on the calling
    (consume loop's) thread instead, see :mod:`.short_bodies`.
    """

    def __init__(
        self,
        pool: cf.Executor,
        memory: held_mod.RequestMemory,
        replier: Replier,
        middleware: MiddlewareChain,
        task_runner: TaskRunner,
        worker_id: str,
        clocks: PeerClocks | None = None,
        short_bodies: ShortBodies | None = None,
    ) -> None:
        self._clocks = clocks or PeerClocks()
        self._short_bodies = short_bodies
        self._pool = pool
        self._memory = memory
        self._replier = replier
        self._middleware = middleware
        self._task_runner = task_runner
        self._worker_id = worker_id

    def runs_here(self, work: pr.WorkUnit, alone: bool) -> bool:
        """Whether :meth:`submit` would run ``work`` on the calling thread.

        ``alone``: no other request waits for its outcome. Then a request
        whose bodies ran short lately runs there (see :mod:`.short_bodies`).
        """
        short = self._short_bodies
        return (
            alone
            and short is not None
            and short.is_short(work.task_cls, work.action)
            and not self._task_runner.gate.closed
        )

    def submit(self, job: Job, here: bool = False) -> None:
        """Hand ``job`` to the pool; raises what the pool raises (e.g. it was shut down).

        ``here`` (what :meth:`runs_here` said): run it on the calling
        thread instead, before this returns, unless the runner's gate
        closed meanwhile.
        """
        self._middleware.after_receive(job)
        if here and not self._task_runner.gate.closed:
            self.perform(job)
            return
        try:
            self._pool.submit(self.perform, job)
        except Exception:
            self._middleware.after_release(job)
            raise

    def perform(self, job: Job) -> None:
        """Run one request on this (pool) thread and send its replies; never raises."""
        task_uuid, work = job.task_uuid, job.work
        outcome: SentOutcome | None = None
        try:
            held = self._memory.start(job.key)
            if held is None:
                return
            refusal = self._middleware.refuse_start(job)
            if refusal is not None:
                self._replier.answering(held)
                self._replier.reply_failure(held.reply_to, task_uuid, refusal, held.attempt)
                LOG.info(
                    "Request %s for task %r dropped unrun: %s", task_uuid, work.task_name, refusal
                )
                self._middleware.after_refuse(job, refusal)
                return
            late = (
                None if held.expires is None else self._clocks.overdue(held.reply_to, held.expires)
            )
            if late is not None:
                # Waited here for a thread past the time its executor gave up.
                self._replier.answering(held)
                self._replier.drop_expired(
                    held.reply_to, task_uuid, work.task_name, late, job.headers
                )
                return
            if not self._replier.started(held):
                LOG.error(
                    "Request %s for task %r not run: its RUNNING reply could not be sent",
                    task_uuid,
                    work.task_name,
                )
                return
            if held.fenced:  # cut off from the broker meanwhile (fence.py): not here
                LOG.warning(
                    "Request %s for task %r not started: this worker lost its"
                    " broker before it could",
                    task_uuid,
                    work.task_name,
                )
                return
            self._middleware.before_execute(job)
            started = time.monotonic()
            progress = functools.partial(self._progress, job, held)
            ctx = context_mod.RequestContext(
                task_uuid,
                work.action,
                held.attempt or 0,
                job.key[2],
                self._worker_id,
                job.cancelled,
            )
            with context_mod.running(ctx):
                result = self._task_runner.run(
                    job.endpoint, job.task, work, progress, job.headers, (task_uuid, work.action)
                )
            elapsed = time.monotonic() - started
            if self._short_bodies is not None:
                self._short_bodies.record(work.task_cls, work.action, elapsed)
            result = self._middleware.override_result(job, result)
            state = pr.FAILURE if isinstance(result, ft.Failure) else pr.SUCCESS
            # Counted, no longer shown as held, and its event sent before the
            # outcome: whoever asks the worker after the outcome sees it counted.
            self._middleware.after_execute(job, result, elapsed)
            outcome = self._replier.send_outcome(held, work, state, result, elapsed)
            if state == pr.SUCCESS:
                LOG.info(
                    "Task %r (%s) %s for request %s finished in %.3f s: %s",
                    work.task_name,
                    work.task_cls,
                    work.action,
                    task_uuid,
                    elapsed,
                    pr.SUCCESS,
                )
            self._middleware.after_reply(job, result, elapsed)
        except Exception:
            LOG.exception("Unexpected error running request %s", task_uuid)
        finally:
            self._middleware.after_release(job)
            if outcome is None or self._memory.is_fenced(job.key):
                self._memory.forget(job.key)
            else:
                self._memory.finish(job.key, outcome.body, outcome.size)

    def _progress(
        self, job: Job, held: held_mod.Held, event_type: str, details: dict[str, Any]
    ) -> None:
        """The body reported progress: tell the middleware, forward it as an EVENT."""
        self._middleware.on_progress(job, event_type, details)
        self._replier.forward_event(held, event_type, details)
