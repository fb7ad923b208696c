"""How a worker takes in messages: checks, duplicates, acknowledgement, hand-over.

:class:`Intake` holds the consume loop's handlers. Nothing a message
contains can make a worker run anything but its endpoints; bad input is
answered with a FAILURE naming the cause when a reply address is known. A
request message is acknowledged (see :mod:`..messaging.delivery`) only once
this worker answers for it, then handed to the :class:`~.performer.Performer`;
while more than ``capacity`` requests are held the loop takes no message
(it asks :meth:`Intake.wait_for_room` first).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import compat as compat_mod
from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.wire.peer_clock import PeerClocks
from flowengine.engines.worker_based.worker_side import held as held_mod
from flowengine.engines.worker_based.worker_side import short_bodies
from flowengine.engines.worker_based.worker_side.endpoint import Endpoint
from flowengine.engines.worker_based.worker_side.middleware import Job
from flowengine.engines.worker_based.worker_side.performer import Performer
from flowengine.engines.worker_based.worker_side.replier import Replier

LOG = logging.getLogger(__name__)


class Intake:
    """Takes NOTIFYs and requests off a worker's consume loop (its thread only).

    Serves ``endpoints`` (task class name -> Endpoint); remembers what it
    holds in ``memory``; answers through ``replier``; hands each request it
    takes to ``performer``; and takes no new message while more than
    ``capacity`` requests are held (None: unbounded) until :meth:`close`.
    ``clocks`` learns each engine's clock from the send times of its
    requests and NOTIFYs, and says when a request expired by that clock.
    ``admit`` (a worker of several topics, see :mod:`.priority`) replaces
    the admission into ``memory``: it waits for this topic's turn first, and
    returns None when the worker stops meanwhile (the message goes back);
    ``room(give_up, seconds)`` then says whether the worker has room to take
    another message (``capacity`` is None).

    ``settle_after_run``: the broker gives an unacknowledged message back at
    once, flagged as a redelivery, when its consumer's connection ends (AMQP).
    A request whose engine takes PENDING late (header ``late_pending``) then
    spares its PENDING only if it runs on the consume loop's thread
    (:mod:`.short_bodies`), and its message is acknowledged only after its
    outcome is sent: should this worker die (or lose the broker) before it
    told its engine it holds the request, the broker hands it to another
    worker, which hands it back to the engine (a declined redelivery), and
    the engine sends it again unless a holder speaks up within a loss bound.
    A late request for the pool is told PENDING with its acknowledgement,
    as any other. So no request is ever held by a worker nobody knows of:
    before, a worker that died within 50 ms of taking a late request lost
    it, and its engine failed it at ``transition_timeout``. The loop takes
    no message while it runs one, so the unacknowledged message keeps no
    other request waiting (prefetch is one).
    """

    def __init__(
        self,
        endpoints: Mapping[str, Endpoint],
        memory: held_mod.RequestMemory,
        replier: Replier,
        performer: Performer,
        capacity: int | None,
        clocks: PeerClocks | None = None,
        admit: Callable[..., held_mod.Verdict | None] | None = None,
        room: Callable[[threading.Event, float], bool] | None = None,
        settle_after_run: bool = False,
    ) -> None:
        self._clocks = clocks or PeerClocks()
        self._settle_after_run = settle_after_run
        self._admit = admit
        self._room = room
        self._endpoints = dict(endpoints)
        self._memory = memory
        self._replier = replier
        self._performer = performer
        self._capacity = capacity
        self._identity = replier.identity
        self._closed = threading.Event()
        # Whether a request is a chain's next (see short_bodies.Pace).
        self._pace = short_bodies.Pace()

    def handlers(self) -> dict[str, dispatcher.Handler]:
        """The worker queues' handlers by message type, with their validators."""
        return {
            pr.NOTIFY: dispatcher.Handler(
                self.process_notify,
                validator=functools.partial(pr.Notify.validate, response=False),
                required_properties=("reply_to",),
            ),
            # A request is acknowledged once this worker answers for it (see
            # _take), not when it arrives.
            pr.REQUEST: dispatcher.Handler(
                self.process_request,
                validator=pr.Request.validate,
                required_properties=("reply_to", "correlation_id"),
                settles=True,
            ),
        }

    def open(self) -> None:
        """Wait for room again when at capacity (after :meth:`close`)."""
        self._closed.clear()

    def close(self) -> None:
        """Stop waiting for room: the consume loop must be free to end."""
        self._closed.set()
        self._memory.wake_waiters()

    def reject(self, message: Delivery, reason: str) -> None:
        """Answer a refused request with FAILURE when we know where and for what."""
        props = message.properties
        reply_to, task_uuid = props.get("reply_to"), props.get("correlation_id")
        if not (
            reply_to and task_uuid and isinstance(reply_to, str) and isinstance(task_uuid, str)
        ):
            return
        # Never answer a NOTIFY or a RESPONSE: two confused peers must not
        # bounce failures at each other forever.
        if props.get("type") in (pr.NOTIFY, pr.RESPONSE):
            return
        error = exc.InvalidFormat(
            f"Worker {self._identity.worker_id} (topic"
            f" {self._identity.topic!r}) rejected request {task_uuid}:"
            f" {reason}"
        )
        self._replier.reply_failure(
            reply_to, task_uuid, error, Headers.parse(message.headers).attempt
        )

    def process_notify(self, data: dict[str, Any], message: Delivery) -> None:
        """Answer a NOTIFY request with our topic and tasks."""
        self._clocks.observe(
            message.properties["reply_to"], Headers.parse(message.headers).enqueued
        )
        self._replier.answer_notify(
            message.properties["reply_to"], message.properties.get("correlation_id")
        )

    def process_request(self, data: dict[str, Any], message: Delivery) -> None:
        """Check a validated request, take it and hand it to the performer; never raises."""
        received = time.monotonic()
        props = message.properties
        reply_to, task_uuid = props["reply_to"], props["correlation_id"]
        compat_mod.note_request(message.headers, reply_to, self._identity.worker_id, task_uuid)
        headers = Headers.parse(message.headers)
        attempt = headers.attempt
        if headers.problems:
            self._replier.reply_failure(
                reply_to, task_uuid, exc.InvalidFormat("; ".join(headers.problems)), attempt
            )
            return
        self._clocks.observe(reply_to, headers.enqueued)
        late = None if headers.expires is None else self._clocks.overdue(reply_to, headers.expires)
        if late is not None:
            self._replier.drop_expired(reply_to, task_uuid, data.get("task_name"), late, headers)
            return
        try:
            work = pr.Request.from_dict(data, task_uuid=task_uuid)
        except Exception as e:
            self._replier.reply_failure(
                reply_to,
                task_uuid,
                exc.InvalidFormat(f"Request {task_uuid} could not be decoded: {e}", cause=e),
                attempt,
            )
            return
        endpoint = self._endpoints.get(work.task_cls)
        if endpoint is None:
            LOG.warning(
                "Request %s names task class %r, which worker %s does not serve",
                task_uuid,
                work.task_cls,
                self._identity.worker_id,
            )
            self._replier.reply_failure(
                reply_to,
                task_uuid,
                exc.UnknownTask(
                    f"Worker {self._identity.worker_id} (topic {self._identity.topic!r}) has no"
                    f" task class {work.task_cls!r}; it serves {list(self._identity.tasks)}"
                ),
                attempt,
            )
            return
        key = (task_uuid, work.action, headers.request_id)
        # PENDING replies/heartbeats only to flowengine executors (they send
        # 'attempt'); TaskFlow's would log each one as unexpected.
        loss_bound = (headers.heartbeat_misses, headers.lost_after)
        if self._admit is None:
            verdict = self._memory.admit(
                key,
                reply_to,
                attempt,
                headers.expires,
                announced=attempt is not None,
                loss_bound=loss_bound,
            )
        else:
            waited = self._admit(
                self._closed,
                key,
                reply_to,
                attempt,
                headers.expires,
                attempt is not None,
                loss_bound=loss_bound,
            )
            if waited is None:  # stopping while it waited for its turn
                message.requeue()
                return
            verdict = waited
        if verdict.kind != held_mod.NEW:
            self._answer_duplicate(verdict, reply_to, task_uuid, work, attempt)
            return
        if message.redelivered and attempt is not None:
            # It may have run elsewhere already (its acknowledgement lost with
            # a broker that crashed): only its engine knows, so it decides.
            self._memory.forget(key)
            self._decline(message, reply_to, task_uuid, work, attempt)
            return
        try:
            task = endpoint.generate(name=work.task_name)
        except Exception as e:
            self._memory.forget(key)
            LOG.warning(
                "Could not create task %r of class %s", work.task_name, work.task_cls, exc_info=True
            )
            self._replier.reply_failure(
                reply_to,
                task_uuid,
                exc.ExecutionFailure(
                    f"Worker {self._identity.worker_id} could not create task"
                    f" {work.task_name!r} of class {work.task_cls}: {e}",
                    cause=e,
                ),
                attempt,
            )
            return
        late = headers.late_pending and attempt is not None
        here = self._performer.runs_here(
            work,
            alone=self._memory.unanswered() == 1
            and self._pace.follows_last(reply_to, headers.enqueued),
        )
        if self._settle_after_run and late and not here:
            # Where a request run here keeps its message until its outcome is
            # sent (see __init__), one for the pool is told PENDING with its
            # acknowledgement as usual: its holder is known from the start.
            late = False
        settle_after_run = late and self._settle_after_run
        if not self._take(
            message, reply_to, task_uuid, work, attempt, late, acknowledge=not settle_after_run
        ):
            self._memory.forget(key)
            return
        if late and verdict.held is not None:  # a NEW verdict always holds it
            self._replier.tell_later(verdict.held)
        try:
            self._performer.submit(
                Job(endpoint, task, work, key, headers, self._identity.topic, verdict.held),
                here=here,
            )
        except Exception as e:
            self._memory.forget(key)
            self._replier.reply_failure(
                reply_to,
                task_uuid,
                exc.ExecutionFailure(
                    f"Worker {self._identity.worker_id} could not schedule request"
                    f" {task_uuid}: {e}",
                    cause=e,
                ),
                attempt,
            )
            return
        # The loop's time with it ends when it was handed over or, run here,
        # answered: the engine cannot send its next request before, while
        # what the loop does after (the log line, middleware, letting go,
        # the acknowledgement) may outlast that request's trip (Pace
        # compares the two).
        held = verdict.held
        done = held.answered_at if here and held is not None else None
        busy_s = (time.monotonic() if done is None else done) - received
        self._pace.took(reply_to, headers.enqueued, busy_s)
        if settle_after_run:
            self._settle_after_run_of(message, task_uuid)

    def _settle_after_run_of(self, message: Delivery, task_uuid: str) -> None:
        """Acknowledge a request run here once its outcome went out (see process_request)."""
        try:
            message.ack()
        except exc.DeliveryNotSettled as e:
            # Its connection ended while it ran: the broker gives it to a
            # worker again, flagged as a redelivery, and that worker hands it
            # back to its engine, which has the outcome (or waits for it).
            LOG.info(
                "Request %s ran on worker %s but its message could not be acknowledged"
                " afterwards (%s); its redelivery will be handed back to its engine unrun",
                task_uuid,
                self._identity.worker_id,
                e,
            )

    def _take(
        self,
        message: Delivery,
        reply_to: str,
        task_uuid: str,
        work: pr.WorkUnit,
        attempt: int | None,
        late: bool = False,
        acknowledge: bool = True,
    ) -> bool:
        """Become the request's holder: acknowledge its message; False if we must not run it.

        A flowengine executor (it sends ``attempt``) is told PENDING with the
        acknowledgement, so from then on it knows who holds the request and
        hears its heartbeats. Had we died before, the broker gives the message
        to another worker (AMQP at once, Redis once our lease lapses); on Redis
        the two are one atomic step, elsewhere PENDING goes first, so a death
        between them leaves an executor told of a holder that went silent
        while the message is redelivered: the next holder's PENDING replaces
        it (or the request is dispatched again after the loss bound).

        ``late``: the executor takes PENDING late (header ``late_pending``):
        the message is acknowledged alone, and PENDING goes out only if the
        request is still held RUNNING_REPLY_DELAY_S later (Replier.tell_later).
        ``acknowledge`` False (only with ``late``): not even that, the caller
        acknowledges it once the request ran.
        """
        try:
            if attempt is not None and not late:
                self._replier.accept(message, reply_to, task_uuid, attempt)
            elif acknowledge:
                message.ack()
            return True
        except exc.DeliveryNotSettled as e:
            LOG.warning(
                "Request %s (%s of %r) not run by worker %s: %s",
                task_uuid,
                work.action,
                work.task_name,
                self._identity.worker_id,
                e,
            )
            return False
        except Exception:
            LOG.error(
                "Request %s (%s of %r) not taken by worker %s: its PENDING reply"
                " could not be sent; the message goes back to the broker",
                task_uuid,
                work.action,
                work.task_name,
                self._identity.worker_id,
                exc_info=True,
            )
        message.requeue()
        return False

    def _decline(
        self, message: Delivery, reply_to: str, task_uuid: str, work: pr.WorkUnit, attempt: int
    ) -> None:
        """Hand a redelivered request back to its engine unrun (see Replier.decline)."""
        try:
            self._replier.decline(message, reply_to, task_uuid, attempt)
        except exc.DeliveryNotSettled as e:
            LOG.warning(
                "Redelivered request %s not declined by worker %s: %s",
                task_uuid,
                self._identity.worker_id,
                e,
            )
            return
        except Exception:
            LOG.error(
                "Redelivered request %s could not be handed back by worker %s; the"
                " message goes back to the broker",
                task_uuid,
                self._identity.worker_id,
                exc_info=True,
            )
            message.requeue()
            return
        LOG.info(
            "Request %s (%s of %r), attempt %d, came back from the broker (a"
            " redelivery: it may have run elsewhere already); worker %s did not run it"
            " and handed it back to its engine, which sends it again only if it still"
            " waits for it",
            task_uuid,
            work.action,
            work.task_name,
            attempt,
            self._identity.worker_id,
        )

    def _answer_duplicate(
        self,
        verdict: held_mod.Verdict,
        reply_to: str,
        task_uuid: str,
        work: pr.WorkUnit,
        attempt: int | None,
    ) -> None:
        """Answer a request already held or finished here from memory (never run it again)."""
        what = f"{work.action} of {work.task_name!r}"
        held, done = verdict.held, verdict.finished
        if verdict.kind == held_mod.STALE and held is not None:
            LOG.warning(
                "Ignored request %s (%s), attempt %s: attempt %s of it is already held here",
                task_uuid,
                what,
                attempt,
                held.attempt,
            )
            return
        if verdict.kind == held_mod.HELD and held is not None:
            state, outcome = self._replier.repeat_state(
                held, reply_to, task_uuid, pending_too=attempt is not None
            )
            LOG.warning(
                "Duplicate of request %s (%s, attempt %s): it is already %s here;"
                " not running it again",
                task_uuid,
                what,
                attempt,
                {held_mod.RUNNING: "running", held_mod.ANSWERED: "answered"}.get(state, "queued"),
            )
            if state == held_mod.ANSWERED and outcome is not None:
                # Its outcome is on its way to the earlier sender; this one
                # (maybe a newer attempt) gets it too, as from the finished ones.
                self._replier.send_remembered(outcome, reply_to, task_uuid, attempt)
            return
        if done is None:  # pragma: no cover - admit() returns one of the four verdicts
            return
        LOG.warning(
            "Duplicate of request %s (%s, attempt %s): it finished here %.1f s ago;"
            " sending its outcome again, not running it again",
            task_uuid,
            what,
            attempt,
            time.monotonic() - done.finished_at,
        )
        if done.outcome is not None:
            self._replier.send_remembered(done.outcome, reply_to, task_uuid, attempt)
            return
        self._replier.reply_failure(
            reply_to,
            task_uuid,
            exc.ExecutionFailure(
                f"Request {task_uuid} ({what}) already ran on worker {self._identity.worker_id};"
                f" its outcome ({done.outcome_bytes} bytes) was too large to keep for"
                f" duplicates"
            ),
            attempt,
        )

    def wait_for_room(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until at most ``capacity`` requests are held.

        The consume loop asks before it takes each message (bounded prefetch):
        so at most capacity + 1 are held (the last one taken before the loop
        noticed). While it waits it keeps its broker connection alive, NOTIFY
        requests wait, and the heartbeat thread keeps announcing this worker.
        True at once after close() (the loop must be free to end).
        """
        if self._room is not None:
            return self._room(self._closed, timeout_s)
        if self._capacity is None:
            return True
        return self._memory.wait_until_at_most(self._capacity, self._closed, timeout_s)
