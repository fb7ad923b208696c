"""What a worker says to executors: replies, outcomes, heartbeats, announcements.

:class:`Replier` publishes every message a worker sends (through its
proxy) and runs the heartbeat thread. Heartbeats come from a thread of
their own, so neither busy task threads nor a consume loop waiting for room
can delay them; its lock keeps the one ordering rule executors rely on: no
heartbeat of a request is ever sent after that request's outcome.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.messaging.proxy import Proxy
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import names
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.worker_side import held as held_mod
from flowengine.engines.worker_based.worker_side.middleware import MiddlewareChain
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

#: A flowengine executor is told RUNNING only about a request still running
#: this long (s) after it started; a shorter one's outcome says it ran. That
#: spares a third of the messages per request (PENDING, RUNNING, outcome).
#: A TaskFlow executor is told at once: it expects RUNNING before an outcome.
RUNNING_REPLY_DELAY_S = 0.05


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a worker is to executors: what its announcements and replies say."""

    #: Unique id of the worker (header ``worker_id`` of its messages).
    worker_id: str
    #: ``hostname:pid`` (header ``origin``).
    origin: str
    #: The topic served.
    topic: str
    #: Task class names served, sorted.
    tasks: tuple[str, ...]


class SentOutcome(NamedTuple):
    """An outcome as sent: its reply body and that body's encoded size (bytes)."""

    body: dict[str, Any]
    size: int


class StoredResponse(pr.Message):
    """A reply body remembered from an earlier run, sent again as it was."""

    TYPE = pr.RESPONSE

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def to_dict(self) -> dict[str, Any]:
        return self._body


class Replier:
    """Publishes a worker's replies and announcements; heartbeats what it holds.

    Every publication goes through ``proxy`` with headers naming the worker
    (``identity``) and its ``heartbeat_interval`` (s), which is also how
    often each request held in ``memory`` is heartbeated. Announcements are
    repeated every ``announce_period_s`` (default: as often as executors
    poll with NOTIFY; they forget a worker after some silence, and the
    heartbeat thread sends them, so a consume loop waiting for room never
    makes a worker look dead). A request dropped as expired is also told to
    ``middleware`` (:meth:`~.middleware.Middleware.after_expire`). Publishing
    errors are logged (and reported as False where the caller decides what
    follows), never raised, except by :meth:`accept`.
    """

    def __init__(
        self,
        proxy: Proxy,
        memory: held_mod.RequestMemory,
        identity: Identity,
        heartbeat_interval: float,
        middleware: MiddlewareChain,
        *,
        announce_period_s: float = pr.NOTIFY_PERIOD_S,
        settles_after_run: bool = False,
    ) -> None:
        self._proxy = proxy
        self._settles_after_run = settles_after_run
        self._memory = memory
        self._identity = identity
        self._interval = heartbeat_interval
        self._middleware = middleware
        self._announce_period_s = announce_period_s
        # Held while a heartbeat decides and sends, and while a request turns
        # ANSWERED: a heartbeat goes out before its request's outcome or not at all.
        self._answer_lock = threading.Lock()
        self._stopping = threading.Event()
        self._beat_thread: threading.Thread | None = None
        # Requests whose state (RUNNING, or a late PENDING) is due to be
        # told (deadline, held), oldest first; the condition wakes the
        # heartbeat thread for the first.
        self._due: collections.deque[tuple[float, held_mod.Held]] = collections.deque()
        self._beat_wake = threading.Condition()
        self._last_announce = time.monotonic()
        # True while the worker must not announce itself (its consume loop keeps failing).
        self._silenced = False

    @property
    def identity(self) -> Identity:
        """Who this worker is to executors."""
        return self._identity

    def headers(self, attempt: int | None = None, leaving: bool = False) -> dict[str, Any]:
        """Headers of a message this worker sends (``attempt``: the request's, echoed)."""
        headers: dict[str, Any] = {
            pr.HEADER_WORKER_ID: self._identity.worker_id,
            pr.HEADER_ORIGIN: self._identity.origin,
            lv.HEADER_HEARTBEAT: self._interval,
        }
        if attempt is not None:
            headers[pr.HEADER_ATTEMPT] = attempt
        if leaving:
            headers[pr.HEADER_LEAVING] = True
        return headers

    def _introduction_headers(self, leaving: bool = False) -> dict[str, Any]:
        """Headers of an announcement or NOTIFY reply: who we are and what we offer."""
        headers = self.headers(leaving=leaving)
        if self._settles_after_run:
            headers[names.HEADER_SETTLES_AFTER_RUN] = True
        return headers

    # --- about the worker ---

    def silence(self, silenced: bool = True) -> None:
        """Stop (or resume) announcing this worker and answering NOTIFYs (goodbyes still go)."""
        self._silenced = silenced

    def announce(self, leaving: bool = False) -> None:
        """Tell every executor who we are and what we run (or that we leave)."""
        if self._silenced and not leaving:
            return
        tasks = [] if leaving else list(self._identity.tasks)
        try:
            self._proxy.publish(
                pr.Notify(topic=self._identity.topic, tasks=tasks),
                pr.ANNOUNCE_ROUTING_KEY,
                headers=self._introduction_headers(leaving=leaving),
            )
        except Exception as e:
            # One line: the consume loop says, once per back-off step, why the
            # broker is away; the traceback is there for -v.
            LOG.warning(
                "Worker %s could not announce itself%s: %s",
                self._identity.worker_id,
                " leaving" if leaving else "",
                e,
            )
            LOG.debug("Announcement failure", exc_info=True)
        self._last_announce = time.monotonic()

    def answer_notify(self, reply_to: str, correlation_id: str | None) -> None:
        """Answer a NOTIFY request with our topic and tasks."""
        if self._silenced:
            return
        try:
            self._proxy.publish(
                pr.Notify(topic=self._identity.topic, tasks=list(self._identity.tasks)),
                reply_to,
                correlation_id=correlation_id,
                headers=self._introduction_headers(),
            )
        except Exception:
            LOG.warning("Failed to answer NOTIFY from %s", reply_to, exc_info=True)

    # --- about a request ---

    def accept(self, delivery: Delivery, reply_to: str, task_uuid: str, attempt: int) -> None:
        """Tell the executor PENDING, acknowledging ``delivery`` with it.

        Raises DeliveryNotSettled when the acknowledgement failed (do not
        run the request), and the publishing error when PENDING could not be
        sent (the delivery is then still unsettled).
        """
        self._proxy.publish(
            pr.Response(pr.PENDING),
            reply_to,
            correlation_id=task_uuid,
            headers=self.headers(attempt),
            settles=delivery,
        )

    def decline(self, delivery: Delivery, reply_to: str, task_uuid: str, attempt: int) -> None:
        """Hand a redelivered request back to its engine unrun, acknowledging it.

        A PENDING with the ``declined`` header: the engine dispatches the
        request again if it still waits for it and nobody else holds it, and
        ignores it when it already has the outcome. Raises as :meth:`accept`.
        """
        headers = {**self.headers(attempt), names.HEADER_DECLINED: True}
        self._proxy.publish(
            pr.Response(pr.PENDING),
            reply_to,
            correlation_id=task_uuid,
            headers=headers,
            settles=delivery,
        )

    def started(self, held: held_mod.Held) -> bool:
        """``held`` starts running: tell its executor RUNNING, now or soon.

        A flowengine executor hears it from the heartbeat thread, and only
        if the request still runs RUNNING_REPLY_DELAY_S from now; a TaskFlow
        one at once. False when it was due at once and could not be sent
        (the request must then not start).
        """
        if not held.announced:
            return self.reply(held.reply_to, held.key[0], pr.RUNNING, held.attempt)
        self.tell_later(held)
        return True

    def tell_later(self, held: held_mod.Held) -> None:
        """Tell ``held``'s executor its state (PENDING or RUNNING) RUNNING_REPLY_DELAY_S from now.

        Sent by the heartbeat thread, and only if it is still held then: a
        request answered sooner costs no message but its outcome.
        """
        with self._beat_wake:
            self._due.append((time.monotonic() + RUNNING_REPLY_DELAY_S, held))
            if len(self._due) == 1:
                self._beat_wake.notify()

    def reply(
        self, reply_to: str, task_uuid: str, state: str, attempt: int | None = None, **data: Any
    ) -> bool:
        """Publish a Response; False (logged) when it could not be sent."""
        try:
            self._proxy.publish(
                pr.Response(state, **data),
                reply_to,
                correlation_id=task_uuid,
                headers=self.headers(attempt),
            )
        except Exception:
            LOG.error(
                "Failed to send %s reply for request %s to %s",
                state,
                task_uuid,
                reply_to,
                exc_info=True,
            )
            return False
        return True

    def reply_failure(
        self, reply_to: str, task_uuid: str, error: BaseException, attempt: int | None = None
    ) -> bool:
        """Publish a FAILURE reply describing ``error`` (an exception created, not raised)."""
        return self.reply(
            reply_to, task_uuid, pr.FAILURE, attempt, result=ft.Failure.from_exception(error)
        )

    def drop_expired(
        self, reply_to: str, task_uuid: str, task_name: str | None, late: float, headers: Headers
    ) -> None:
        """Say (log, middleware, FAILURE reply) that a request ``late`` s past expiry is dropped.

        ``late`` is measured on its engine's clock (see :mod:`..wire.peer_clock`).
        """
        LOG.info(
            "Dropped request %s for task %r unrun: it expired %.3f s ago and nobody"
            " waits for it any more",
            task_uuid,
            task_name,
            late,
        )
        self._middleware.after_expire(self._identity.topic, task_uuid, task_name, headers)
        # Its executor has normally given up already (within its expiry
        # margin) and ignores this reply.
        self.reply_failure(
            reply_to,
            task_uuid,
            exc.RequestExpired(
                f"Worker {self._identity.worker_id} dropped request {task_uuid} for task"
                f" {task_name!r} unrun: it expired {late:.3f} s before it could start"
            ),
            headers.attempt,
        )

    def forward_event(self, held: held_mod.Held, event_type: str, details: dict[str, Any]) -> None:
        """Forward a task notification (progress) to the executor as an EVENT."""
        task_uuid = held.key[0]
        try:
            self._proxy.publish(
                pr.Response(pr.EVENT, event_type=event_type, details=dict(details or {})),
                held.reply_to,
                correlation_id=task_uuid,
                headers=self.headers(held.attempt),
            )
        except Exception:
            LOG.warning(
                "Failed to send %s event for request %s", event_type, task_uuid, exc_info=True
            )

    def send_outcome(
        self,
        held: held_mod.Held,
        work: pr.WorkUnit,
        state: str,
        result: Any,
        run_s: float | None = None,
    ) -> SentOutcome | None:
        """Publish SUCCESS/FAILURE; return what was sent (None if nothing was).

        ``run_s``: how long the body ran (header ``run_s``: the executor's
        timings need it when no RUNNING was sent). An unencodable outcome
        becomes a FAILURE naming why.
        """
        task_uuid = held.key[0]
        try:
            body = pr.Response(state, result=result).to_dict()
            self.answering(held, body)
            return SentOutcome(body, self._send_body(held, body, run_s))
        except exc.SerializationFailure as e:
            what = "result" if state == pr.SUCCESS else "failure"
            error = exc.SerializationFailure(
                f"The {what} of task {work.task_name!r} ({work.task_cls}, {work.action})"
                f" cannot be sent as JSON: {e.cause or e}"
            )
            LOG.warning("Request %s: %s", task_uuid, error.args[0])
        except Exception:
            LOG.error(
                "Failed to send %s reply for request %s to %s",
                state,
                task_uuid,
                held.reply_to,
                exc_info=True,
            )
            return None
        body = pr.Response(pr.FAILURE, result=ft.Failure.from_exception(error)).to_dict()
        self.answering(held, body)
        try:
            return SentOutcome(body, self._send_body(held, body, run_s))
        except Exception:
            LOG.error(
                "Failed to send FAILURE reply for request %s to %s",
                task_uuid,
                held.reply_to,
                exc_info=True,
            )
            return None

    def _send_body(self, held: held_mod.Held, body: dict[str, Any], run_s: float | None) -> int:
        """Publish an outcome body; its encoded size (bytes)."""
        headers = self.headers(held.attempt)
        if run_s is not None:
            headers[names.HEADER_RUN_S] = round(run_s, 6)
        return self._proxy.publish(
            StoredResponse(body), held.reply_to, correlation_id=held.key[0], headers=headers
        )

    def send_remembered(
        self, outcome: dict[str, Any], reply_to: str, task_uuid: str, attempt: int | None
    ) -> None:
        """Send a request's outcome body again, for a duplicate of it."""
        try:
            self._proxy.publish(
                StoredResponse(outcome),
                reply_to,
                correlation_id=task_uuid,
                headers=self.headers(attempt),
            )
        except Exception:
            LOG.error(
                "Failed to send the remembered outcome of request %s to %s",
                task_uuid,
                reply_to,
                exc_info=True,
            )

    def repeat_state(
        self, held: held_mod.Held, reply_to: str, task_uuid: str, pending_too: bool
    ) -> tuple[str, dict[str, Any] | None]:
        """Tell a duplicate's sender where ``held`` is; (its state, its outcome if ANSWERED).

        RUNNING is repeated; QUEUED only when ``pending_too`` (a flowengine
        executor, which understands PENDING); nothing once ANSWERED (the
        caller sends the outcome). Under the answer lock, so the state cannot
        turn ANSWERED between reading it and repeating it.
        """
        with self._answer_lock:
            state, outcome = held.state, held.outcome
            if state == held_mod.RUNNING or (state == held_mod.QUEUED and pending_too):
                self.reply(reply_to, task_uuid, state, held.attempt)
        return state, outcome

    def answering(self, held: held_mod.Held, outcome: dict[str, Any] | None = None) -> None:
        """``held``'s outcome is about to be sent: no heartbeat for it from now on.

        ``outcome`` (the reply body) is kept for duplicates that arrive before
        the request is remembered as finished.
        """
        with self._answer_lock:
            self._memory.answer(held, outcome)

    def give_back(self, key: tuple[str, str], error: BaseException) -> bool:
        """Answer held request ``key`` with FAILURE ``error`` (cold shutdown; attempt kept).

        True when answered (or its own outcome is already on its way), False
        when it is not held or the FAILURE could not be sent.
        """
        for held in self._memory.held():
            if held.key[:2] == key:
                with self._answer_lock:
                    if not self._memory.answer(held):
                        return True  # its own outcome is on its way
                return self.reply_failure(held.reply_to, key[0], error, held.attempt)
        return False

    # --- heartbeats ---

    def send_heartbeats(self) -> int:
        """Repeat PENDING/RUNNING for every held request now; how many were sent."""
        sent: list[tuple[held_mod.Held, float]] = []
        for held in self._memory.held():
            # Under the lock answering() takes: a heartbeat is either sent
            # before the outcome or not at all, never after it.
            with self._answer_lock:
                if held.state == held_mod.ANSWERED or held.fenced:
                    continue
                if held.state == held_mod.RUNNING or held.announced:
                    started = time.monotonic()
                    if self.reply(held.reply_to, held.key[0], held.state, held.attempt):
                        sent.append((held, started))
        # Known to have reached the broker: the fence (fence.py) counts from there.
        if sent and self._proxy.confirm_published():
            for held, started in sent:
                held.confirmed_at = max(held.confirmed_at, started)
        return len(sent)

    def beat(self) -> None:
        """One round of the heartbeat thread: heartbeats, then an announcement when due."""
        self.send_heartbeats()
        # Only while consuming: without a broker connection the announcement
        # would only fail (and the consumer announces anew when it is back).
        if (
            not self._stopping.is_set()
            and self._proxy.is_running
            and time.monotonic() - self._last_announce >= self._announce_period_s
        ):
            self.announce()

    def start(self) -> None:
        """Start the heartbeat thread (again, after stop()); it runs until stopped and idle."""
        self._stopping.clear()
        if self._beat_thread is None or not self._beat_thread.is_alive():
            self._beat_thread = threading.Thread(
                target=self._beat_loop,
                name=f"flowengine-heartbeat-{self._identity.topic}",
                daemon=True,
            )
            self._beat_thread.start()

    def stop(self) -> None:
        """Let the heartbeat thread end once nothing is held (held requests keep beating)."""
        self._stopping.set()
        with self._beat_wake:
            # Not a heartbeat interval later: with nothing held it ends now.
            self._beat_wake.notify()

    def join(self, timeout_s: float) -> bool:
        """Wait until the heartbeat thread ended, ``timeout_s`` at most; True if it did.

        It ends once stopped and nothing is held: called then, at once.
        """
        thread = self._beat_thread
        if thread is None or thread is threading.current_thread():
            return True
        with self._beat_wake:
            self._beat_wake.notify()  # to look again whether it may end
        thread.join(timeout_s)
        return not thread.is_alive()

    def _beat_loop(self) -> None:
        """Heartbeat every held request and re-announce, until stopped and idle.

        A thread of its own: busy task threads, a consume loop waiting for
        room or a slow broker hop on the request path cannot delay it (short
        of a task holding the GIL in one C call longer than the bound).
        """
        next_beat = time.monotonic() + self._interval
        while not (self._stopping.is_set() and len(self._memory) == 0):
            due = self._wait_for_due(next_beat)
            try:
                if due:
                    self._send_due(due)
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self._interval
                    self.beat()
            except Exception:
                LOG.exception("Heartbeat of worker %s failed; retrying", self._identity.worker_id)

    def _wait_for_due(self, next_beat: float) -> list[held_mod.Held]:
        """Wait for the next heartbeat or RUNNING due; the requests whose RUNNING is due.

        Those due within half the delay come along: one wake-up serves a
        stream of short requests, each told RUNNING at most that much early.
        """
        with self._beat_wake:
            wake_at = next_beat
            if self._due:
                wake_at = min(wake_at, self._due[0][0])
            timeout = wake_at - time.monotonic()
            if timeout > 0:
                self._beat_wake.wait(timeout)
            horizon = time.monotonic() + RUNNING_REPLY_DELAY_S / 2
            due = []
            while self._due and self._due[0][0] <= horizon:
                due.append(self._due.popleft()[1])
            return due

    def _send_due(self, due: list[held_mod.Held]) -> None:
        """Tell each of ``due`` still held its state, PENDING or RUNNING (see tell_later())."""
        for held in due:
            with self._answer_lock:
                if held.state in (held_mod.QUEUED, held_mod.RUNNING) and not held.fenced:
                    self.reply(held.reply_to, held.key[0], held.state, held.attempt)
