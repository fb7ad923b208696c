"""A worker's memory of the requests it holds and recently finished (duplicates).

A request is keyed by (task uuid, action, submission id): TaskFlow reuses a
task's uuid for its execute and its revert, and a Retry executes the same
task uuid again under a new submission. A duplicate delivery of a key the
worker holds (queued or running) or finished within ``keep_s`` is answered
from here, never run again.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple

#: Finished requests remembered at most (oldest forgotten first): enough for
#: minutes of a busy worker's output, small enough to stay a few MB.
FINISHED_MAX_ENTRIES = 4096

#: Seconds a finished request is remembered: longer than any redelivery or
#: re-dispatch of it can arrive (those come within a transition timeout).
FINISHED_KEEP_S = 600.0

#: Largest encoded outcome (bytes) kept for re-sending; a larger one is
#: remembered as "finished" without its result (see Verdict.FINISHED).
MAX_KEPT_OUTCOME_BYTES = 64 * 1024

Key = tuple[str, str, "str | None"]

# Where a held request is.
QUEUED = "PENDING"
RUNNING = "RUNNING"
#: Its outcome is being (or was) sent: no heartbeat may follow it.
ANSWERED = "ANSWERED"


class Held:
    """One request this worker holds: where to reply, which attempt, whether started."""

    __slots__ = ("key", "reply_to", "attempt", "state", "announced", "expires", "outcome")

    def __init__(self, key: Key, reply_to: str, attempt: int | None,
                 expires: float | None, announced: bool) -> None:
        self.key = key
        self.reply_to = reply_to
        self.attempt = attempt
        self.expires = expires
        self.state = QUEUED
        #: Whether PENDING heartbeats may be sent (a flowengine executor asked).
        self.announced = announced
        #: The reply body being sent once ANSWERED: a duplicate arriving
        #: before the request moves to the finished ones is answered with it.
        self.outcome: dict[str, Any] | None = None


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
    """Requests held (queued/running) and finished recently; thread-safe."""

    def __init__(self, max_finished: int = FINISHED_MAX_ENTRIES,
                 keep_s: float = FINISHED_KEEP_S,
                 max_outcome_bytes: int = MAX_KEPT_OUTCOME_BYTES) -> None:
        self._lock = threading.Lock()
        self._held: dict[Key, Held] = {}
        self._finished: OrderedDict[Key, Finished] = OrderedDict()
        self._max_finished = max_finished
        self._keep_s = keep_s
        self._max_outcome_bytes = max_outcome_bytes

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, key: Key, reply_to: str, attempt: int | None,
              expires: float | None = None, announced: bool = False) -> Verdict:
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
            held = self._held[key] = Held(key, reply_to, attempt, expires, announced)
            return Verdict(NEW, held=held)

    def start(self, key: Key) -> Held | None:
        """Mark a held request as running; its current Held (None if forgotten)."""
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held.state = RUNNING
            return held

    def finish(self, key: Key, outcome: dict[str, Any] | None) -> None:
        """Stop holding ``key``; remember its outcome body when it has a submission id."""
        with self._lock:
            self._held.pop(key, None)
            if key[2] is None or self._max_finished <= 0:
                return  # no submission id: a later request may be a Retry's re-run
            size = 0
            if outcome is not None:
                try:
                    size = len(json.dumps(outcome))
                except (TypeError, ValueError):  # encodable by kombu only: not kept
                    size, outcome = 0, None
                if size > self._max_outcome_bytes:
                    outcome = None
            self._finished[key] = Finished(outcome, time.monotonic(), size)
            self._finished.move_to_end(key)
            while len(self._finished) > self._max_finished:
                self._finished.popitem(last=False)

    def forget(self, key: Key) -> None:
        """Stop holding ``key`` without remembering it (it never ran)."""
        with self._lock:
            self._held.pop(key, None)

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
