"""A worker's memory of the requests it holds and recently finished (duplicates).

A request is keyed by (task uuid, action, submission id): TaskFlow reuses a
task's uuid for its execute and its revert, and a Retry executes the same
task uuid again under a new submission. A duplicate delivery of a key the
worker holds (queued or running) or finished within ``keep_s`` is answered
from here, never run again.

Each held request moves through a small machine (declared with automaton,
frozen, read once into :data:`TRANSITIONS`), and only :class:`RequestMemory`
moves it, under its lock: QUEUED (taken, waiting for a thread) to RUNNING to
ANSWERED (its outcome is being sent: no heartbeat may follow), or QUEUED to
ANSWERED when a cold shutdown gives it back before a thread started it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple

from automaton import machines

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire import names
from flowengine.engines.worker_based.wire.machine import make_an_event

LOG = logging.getLogger(__name__)

#: Finished requests remembered at most (oldest forgotten first): enough for
#: minutes of a busy worker's output, small enough to stay a few MB.
FINISHED_MAX_ENTRIES = 4096

#: Seconds a finished request is remembered: longer than any redelivery or
#: re-dispatch of it can arrive (those come within a transition timeout).
FINISHED_KEEP_S = 600.0

#: Largest encoded outcome (bytes) kept for re-sending; a larger one is
#: remembered as "finished" without its result (see Verdict.FINISHED).
MAX_KEPT_OUTCOME_BYTES = 64 * 1024

#: Longest single wait (s) of a thread waiting for room (see
#: :meth:`RequestMemory.wait_until_at_most`): it re-checks its give-up event
#: at least this often even if nobody wakes it.
ROOM_WAIT_SLICE_S = 0.5

Key = tuple[str, str, "str | None"]

# Where a held request is. QUEUED carries the wire name PENDING: it is the
# state a heartbeat of a queued request repeats to its executor.
QUEUED = names.PENDING
RUNNING = names.RUNNING
#: Its outcome is being (or was) sent: no heartbeat may follow it.
ANSWERED = "ANSWERED"


def build_held_machine(freeze: bool = True) -> machines.FiniteMachine:
    """Build the state machine of a request a worker holds."""
    m = machines.FiniteMachine()
    m.add_state(QUEUED)
    m.add_state(RUNNING)
    m.add_state(ANSWERED, terminal=True)
    # Taken (acknowledged), waiting for one of the pool's threads.
    m.default_start_state = QUEUED
    # A thread started it.
    m.add_transition(QUEUED, RUNNING, make_an_event(RUNNING))
    # Its outcome is being sent (or it expired while it waited for the thread).
    m.add_transition(RUNNING, ANSWERED, make_an_event(ANSWERED))
    # A cold shutdown gave it back before any thread started it.
    m.add_transition(QUEUED, ANSWERED, make_an_event(ANSWERED))
    if freeze:
        m.freeze()
    return m


# Built once: held requests move through a (state, event) -> state table
# read off the frozen machine, as requests on the executor side do.
MACHINE = build_held_machine()
TRANSITIONS: dict[tuple[str, str], str] = {(s, e): t for s, e, t in MACHINE}


class Held:
    """One request this worker holds: where to reply, which attempt, where it is.

    Its ``state`` is moved by :class:`RequestMemory` only (see
    :meth:`RequestMemory.start` and :meth:`RequestMemory.answer`).
    """

    __slots__ = (
        "key",
        "reply_to",
        "attempt",
        "state",
        "announced",
        "expires",
        "outcome",
        "confirmed_at",
        "loss_bound",
        "fenced",
        "answered_at",
    )

    def __init__(
        self,
        key: Key,
        reply_to: str,
        attempt: int | None,
        expires: float | None,
        announced: bool,
        loss_bound: tuple[int | None, float | None] = (None, None),
    ) -> None:
        self.key = key
        self.reply_to = reply_to
        self.attempt = attempt
        self.expires = expires
        self.state = QUEUED  # the machine's start state
        #: Whether PENDING heartbeats may be sent (a flowengine executor asked).
        self.announced = announced
        #: The reply body being sent once ANSWERED: a duplicate arriving
        #: before the request moves to the finished ones is answered with it.
        self.outcome: dict[str, Any] | None = None
        #: Monotonic time the latest reply about it known to have reached the
        #: broker was sent (taking it counts): see worker_side/fence.py.
        self.confirmed_at = time.monotonic()
        #: Its engine's (heartbeat_misses, lost_after) headers.
        self.loss_bound = loss_bound
        #: Stopped (or never to start) because this worker lost its broker.
        self.fenced = False
        #: Monotonic time it was answered (its outcome about to be sent).
        self.answered_at: float | None = None

    def __repr__(self) -> str:
        return f"<Held {self.key[0]} ({self.key[1]}) {self.state}>"

    def transition(self, new_state: str) -> bool:
        """Move to ``new_state``: True if moved, False if already there.

        Raises InvalidState for a move the machine does not allow (a bug
        in the caller: nothing a peer sends can cause one).
        """
        if self.state == new_state:
            return False
        target = TRANSITIONS.get((self.state, make_an_event(new_state)))
        if target is None:
            raise exc.InvalidState(
                f"Held request {self.key[0]} ({self.key[1]}) cannot move"
                f" from {self.state} to {new_state}"
            )
        self.state = target
        return True


class Finished(NamedTuple):
    """A request this worker finished: its reply body (None if too large to keep)."""

    outcome: dict[str, Any] | None
    finished_at: float
    outcome_bytes: int


class Verdict(NamedTuple):
    """What to do with an arriving request: run it, or answer from memory."""

    kind: str  # NEW, HELD, FINISHED or STALE
    held: Held | None = None
    finished: Finished | None = None


NEW, HELD, FINISHED, STALE = "new", "held", "finished", "stale"


class RequestMemory:
    """Requests held (queued/running) and finished recently; thread-safe.

    Also where a thread waits for room (fewer requests held): every request
    that stops being held wakes it.
    """

    def __init__(
        self,
        max_finished: int = FINISHED_MAX_ENTRIES,
        keep_s: float = FINISHED_KEEP_S,
        max_outcome_bytes: int = MAX_KEPT_OUTCOME_BYTES,
        condition: threading.Condition | None = None,
    ) -> None:
        # ``condition``: shared with other memories of the same worker (its
        # topics), so a request leaving any of them wakes all their waiters.
        self._lock = condition or threading.Condition()
        self._held: dict[Key, Held] = {}
        self._finished: OrderedDict[Key, Finished] = OrderedDict()
        self._max_finished = max_finished
        self._keep_s = keep_s
        self._max_outcome_bytes = max_outcome_bytes

    def __len__(self) -> int:
        return len(self._held)

    def unanswered(self) -> int:
        """How many held requests are not answered yet (queued or running).

        A request is answered as its outcome is about to be sent and held
        until its thread lets go of it just after: a chain's next request,
        sent once that outcome arrived, may find it still held, never
        unanswered.
        """
        with self._lock:
            return sum(1 for held in self._held.values() if held.state != ANSWERED)

    def admit(
        self,
        key: Key,
        reply_to: str,
        attempt: int | None,
        expires: float | None = None,
        announced: bool = False,
        loss_bound: tuple[int | None, float | None] = (None, None),
    ) -> Verdict:
        """Hold a new request, or say why not (a duplicate of a held/finished one).

        A duplicate with a higher attempt is adopted by the held request:
        its heartbeats and outcome then carry the newer attempt, which is the
        one its executor waits for.
        """
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                if attempt is not None and held.attempt is not None and attempt < held.attempt:
                    return Verdict(STALE, held=held)
                if attempt is not None:
                    held.attempt = attempt
                held.reply_to = reply_to
                return Verdict(HELD, held=held)
            self._expire(time.monotonic())
            done = self._finished.get(key)
            if done is not None:
                return Verdict(FINISHED, finished=done)
            held = self._held[key] = Held(key, reply_to, attempt, expires, announced, loss_bound)
            return Verdict(NEW, held=held)

    def start(self, key: Key) -> Held | None:
        """Mark a held request RUNNING; its Held, or None when it must not start.

        None when it is no longer held, or was already answered (a cold
        shutdown gave it back while it waited for this thread).
        """
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return None
            if held.state == ANSWERED or held.fenced:
                LOG.info(
                    "Request %s (%s) was given back before a thread could start it;"
                    " not starting it",
                    key[0],
                    key[1],
                )
                return None
            held.transition(RUNNING)
            return held

    def answer(self, held: Held, outcome: dict[str, Any] | None = None) -> bool:
        """Mark ``held`` ANSWERED: its outcome (or a give-back) is being sent.

        ``outcome``, the reply body, is kept for duplicates arriving before
        the request is finished; given again, it replaces the first (an
        outcome that could not be sent became a FAILURE). False when it was
        already ANSWERED.
        """
        with self._lock:
            moved = held.transition(ANSWERED)
            if moved:
                held.answered_at = time.monotonic()
            if outcome is not None:
                held.outcome = outcome
            return moved

    def fence(self, held: Held) -> str | None:
        """Mark ``held`` fenced; its state then (None: already answered or fenced)."""
        with self._lock:
            if held.fenced or held.state == ANSWERED or self._held.get(held.key) is not held:
                return None
            held.fenced = True
            return held.state

    def is_fenced(self, key: Key) -> bool:
        """Whether the request held under ``key`` was fenced (never remembered as done)."""
        with self._lock:
            held = self._held.get(key)
            return held is not None and held.fenced

    def finish(self, key: Key, outcome: dict[str, Any], outcome_bytes: int) -> None:
        """Stop holding ``key``; remember its outcome body when it has a submission id.

        ``outcome_bytes``: the body's encoded size, as it was sent; a body
        larger than the memory keeps is remembered without its content.
        """
        with self._lock:
            self._held.pop(key, None)
            self._lock.notify_all()
            if key[2] is None or self._max_finished <= 0:
                return  # no submission id: a later request may be a Retry's re-run
            kept = outcome if outcome_bytes <= self._max_outcome_bytes else None
            self._finished[key] = Finished(kept, time.monotonic(), outcome_bytes)
            self._finished.move_to_end(key)
            while len(self._finished) > self._max_finished:
                self._finished.popitem(last=False)

    def forget(self, key: Key) -> None:
        """Stop holding ``key`` without remembering it (it never ran)."""
        with self._lock:
            self._held.pop(key, None)
            self._lock.notify_all()

    def wait_until_at_most(
        self, count: int, give_up: threading.Event, timeout_s: float | None = None
    ) -> bool:
        """Block while more than ``count`` requests are held, until ``give_up`` is set.

        Or for ``timeout_s`` at most (None: no limit). True when at most
        ``count`` are held (or ``give_up`` is set). Whoever sets ``give_up``
        calls :meth:`wake_waiters` so the wait ends at once.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while len(self._held) > count and not give_up.is_set():
                wait = ROOM_WAIT_SLICE_S
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return False
                self._lock.wait(wait)
            return True

    def wait_until_none_held(self, keys: set[tuple[str, str]], deadline: float) -> bool:
        """Block until no request whose (uuid, action) is in ``keys`` is held.

        Or until ``deadline`` (time.monotonic()) passes; True when none is.
        """
        with self._lock:
            return self._lock.wait_for(
                lambda: not any(key[:2] in keys for key in self._held),
                max(0.0, deadline - time.monotonic()),
            )

    def wake_waiters(self) -> None:
        """Wake every thread in :meth:`wait_until_at_most` to check again."""
        with self._lock:
            self._lock.notify_all()

    def held(self) -> list[Held]:
        """A snapshot of the requests held now."""
        with self._lock:
            return list(self._held.values())

    def finished_count(self) -> int:
        """How many finished requests are remembered."""
        with self._lock:
            self._expire(time.monotonic())
            return len(self._finished)

    def _expire(self, now: float) -> None:
        """Forget finished requests older than keep_s (lock held)."""
        while self._finished:
            key, done = next(iter(self._finished.items()))
            if now - done.finished_at < self._keep_s:
                return
            del self._finished[key]
