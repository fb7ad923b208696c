"""The backend contract of a jobboard: the atomic operations a server must provide.

:class:`BoardStore` is what one backend module implements (memory, Redis,
SQL, ZooKeeper). :class:`flowengine.jobs.board.LeasedJobBoard` builds
TaskFlow's whole jobboard API, leases, fencing, attempts, dead letter and
outcomes on top of it. Every method that changes the board must be atomic
on the server: either all of its effects happen or none, and no other
client sees a state in between. Errors a store raises:

* :class:`~flowengine.exceptions.NotFound` - no such job (or, for finish,
  nobody holds a claim on it);
* :class:`~flowengine.exceptions.UnclaimableJob` - claimed by someone, or
  backing off, or just dead-lettered;
* :class:`~flowengine.exceptions.ClaimLost` - the token is not the job's
  newest claim (fenced);
* :class:`~flowengine.exceptions.JobFailure` - ``who`` is not the owner, or
  stored data is unreadable;
* :class:`~flowengine.exceptions.BoardUnavailable` - the server could not be
  reached (recoverable: the caller may retry).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flowengine import exceptions as exc
from flowengine.jobs import records
from flowengine.jobs.records import Claim, JobRecord, Outcome

__all__ = [
    "Action",
    "BoardEvent",
    "BoardStore",
    "EventKind",
    "check_finisher",
    "held",
    "Finished",
    "finish_order",
    "newest_first",
]

#: A consumed job as the finished listing gives it: what it was, how it ended.
Finished = tuple[JobRecord, Outcome]


def finish_order(done: Outcome) -> tuple[float, int]:
    """Sorts outcomes by when they were recorded; two in one millisecond by claim token.

    Tokens grow with every claim on a board, so the later claim of a tie
    comes later (the finish times themselves cannot tell them apart).
    """
    return (done.at, done.token)


def newest_first(found: Sequence[Finished], limit: int) -> list[Finished]:
    """The ``limit`` most recently finished of ``found``, newest first."""
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, not {limit}")
    return sorted(found, key=lambda pair: finish_order(pair[1]), reverse=True)[:limit]


def held(uuid: str, owner: str | None) -> exc.UnclaimableJob:
    """The error for a claim refused because someone holds (or is taking) the job.

    Its ``held_by`` tells a conductor to list again: the holder's lease is due later.
    """
    what = f"already claimed by {owner}" if owner else "being claimed by another claimer"
    error = exc.UnclaimableJob(f"Job {uuid} {what}")
    error.held_by = owner or "?"  # type: ignore[attr-defined]
    return error


def check_finisher(
    action: Action, uuid: str, who: str, token: int, owner: Any, current: int
) -> None:
    """Raise unless ``who`` holds claim ``token`` of job ``uuid`` (whose claim is ``current``).

    For the stores that check it in Python before one fenced transaction.
    """
    if not owner:
        raise exc.NotFound(f"Can not {action.value} job {uuid}: nobody claimed it")
    if current != token:
        raise exc.ClaimLost(
            f"Can not {action.value} job {uuid}: claim {token} was"
            f" superseded by claim {current} of {owner}"
        )
    if owner != who:
        raise exc.JobFailure(
            f"Can not {action.value} job {uuid} which is not owned"
            f" by {who} (it is owned by {owner})"
        )


class Action(enum.StrEnum):
    """How a claimer finishes a claimed job."""

    #: Done: remove the job, record its outcome.
    CONSUME = "consume"
    #: Broken: move it to the trash, outcome TRASHED.
    TRASH = "trash"
    #: Given back untried (graceful stop): the attempt does not count.
    ABANDON = "abandon"
    #: Given back after a failed attempt: back off, or dead-letter after the last.
    FAIL = "fail"


class EventKind(enum.StrEnum):
    """What a board event says happened."""

    POSTED = "posted"
    #: A claim was given back: the job is claimable (maybe after a back-off).
    RELEASED = "released"
    #: The job left the board (consumed, trashed, dead-lettered).
    DONE = "done"
    #: Delivery may have had a gap (reconnection): re-read what you wait for.
    RESYNC = "resync"
    #: The job was claimed: a hint for other claimers to try another one
    #: (it makes no work available, so it wakes no waiter). Not every store
    #: sends it; older readers ignore a kind they do not know.
    CLAIMED = "claimed"


@dataclass(frozen=True)
class BoardEvent:
    """One notification from the board's server."""

    kind: EventKind
    uuid: str | None = None
    outcome: str | None = None

    def encode(self) -> str:
        """``kind uuid outcome`` as one line (the wire form on every backend)."""
        return " ".join(
            p for p in (self.kind.value, self.uuid or "-", self.outcome or "") if p
        ).strip()

    @classmethod
    def decode(cls, text: str | bytes) -> BoardEvent | None:
        """Parse ``encode``'s form; None for anything else (it is ignored)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        parts = text.split()
        try:
            kind = EventKind(parts[0])
        except (IndexError, ValueError):
            return None
        uuid = parts[1] if len(parts) > 1 and parts[1] != "-" else None
        return cls(kind, uuid, parts[2] if len(parts) > 2 else None)


class BoardStore(abc.ABC):
    """Atomic job operations on one board's server (see the module docstring)."""

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """Whether connect() succeeded and close() was not called since."""

    @abc.abstractmethod
    def connect(self) -> None:
        """Reach the server (BoardUnavailable if it cannot), create what is missing."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and stop the event thread (idempotent)."""

    @abc.abstractmethod
    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """Store a new job; its posting gets the board's next ``sequence``."""

    @abc.abstractmethod
    def listing(self) -> list[JobRecord]:
        """Every listed job (claimed or not), in no particular order."""

    def count(self) -> int:
        """How many jobs are listed (override when the server counts cheaper)."""
        return len(self.listing())

    @abc.abstractmethod
    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is (listed, trash, dead letter, consumed); None if unknown.

        A consumed job is kept (``where`` CONSUMED) as long as its outcome.
        """

    @abc.abstractmethod
    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """Lease a listed job to ``who`` under the board's next token (see the module doc).

        A job already claimed ``max_attempts`` times goes to the dead letter
        (outcome DEAD, event DONE) and UnclaimableJob is raised.
        """

    @abc.abstractmethod
    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Extend each ``(uuid, token)`` lease still held; return the uuids lost.

        A lease that ran out while nobody claimed the job since is taken
        back (the token still rules it).
        """

    @abc.abstractmethod
    def finish(
        self,
        uuid: str,
        who: str,
        token: int,
        action: Action,
        *,
        outcome: str | None = None,
        reason: str | None = None,
        backoff_s: float = 0.0,
        max_attempts: int = 1,
        outcome_ttl_s: float = 0.0,
    ) -> Outcome | None:
        """Consume / trash / abandon / fail a claim, fenced by ``token``.

        Returns the recorded Outcome when the job left the board (CONSUME,
        TRASH, or FAIL on its last attempt), None when it stays listed.
        """

    def consume_and_claim(
        self,
        uuid: str,
        who: str,
        token: int,
        next_uuid: str,
        *,
        outcome: str,
        reason: str | None,
        lease_s: float,
        max_attempts: int,
        outcome_ttl_s: float,
    ) -> tuple[Outcome | None, Claim | None]:
        """Consume claim ``token`` and, where it costs no more, claim ``next_uuid`` for ``who``.

        The consume is :meth:`finish`'s, with its errors. The claim is made
        only in the same atomic write as the consume (so one round trip and
        one durable write serve both), and only if it would succeed: None
        otherwise, and the caller claims as usual. This default never claims.
        """
        done = self.finish(
            uuid,
            who,
            token,
            Action.CONSUME,
            outcome=outcome,
            reason=reason,
            max_attempts=max_attempts,
            outcome_ttl_s=outcome_ttl_s,
        )
        return done, None

    @abc.abstractmethod
    def outcome(self, uuid: str) -> Outcome | None:
        """How the job ended, or None (still on the board, unknown, or expired)."""

    @abc.abstractmethod
    def parked(self, where: str) -> list[JobRecord]:
        """The jobs in the trash (``records.IN_TRASH``) or dead letter (``IN_DEAD_LETTER``).

        A store that keeps consumed jobs in a place of their own also lists
        them for ``records.CONSUMED`` (expired ones may still be among them).
        """

    def finished(self, limit: int) -> list[Finished]:
        """The consumed jobs whose outcome is still kept, newest first, at most ``limit``.

        A consumed job (outcome succeeded, reverted or failed) is kept as
        long as its outcome (the board's ``outcome_ttl_s``), then forgotten.
        This default reads ``parked(CONSUMED)`` and each job's outcome; a
        store that reads both at once, or keeps consumed jobs elsewhere,
        overrides it.
        """
        found = []
        for rec in self.parked(records.CONSUMED):
            done = self.outcome(rec.uuid)
            if done is not None:  # None: expired between the two reads
                found.append((rec, done))
        return newest_first(found, limit)

    @abc.abstractmethod
    def requeue(self, uuid: str, max_attempts: int) -> JobRecord:
        """Put a trashed or dead-lettered job back on the board, attempts reset.

        Its outcome is forgotten; NotFound if it is in neither place.
        """

    def extend_lease(self, uuid: str, token: int, lease_s: float) -> bool:
        """Set the lease of the claim ``token`` to ``lease_s`` from now; False if lost.

        One claim renewed as :meth:`renew` renews many. A store whose
        renew() cannot give a lease another length (etcd keeps a lease alive
        at the length it was granted with) overrides this.
        """
        return not self.renew([(uuid, token)], lease_s)

    @abc.abstractmethod
    def lease_remaining(self, uuid: str) -> float | None:
        """Seconds until the current lease ends; None if the job is not leased."""

    @abc.abstractmethod
    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """Record an entity (``Entity.to_dict()``) using the board, for ``ttl_s``."""

    @abc.abstractmethod
    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver every board event to ``callback`` from now until close().

        Must be subscribed when this returns (events after it are not lost
        while connected); a reconnection delivers RESYNC.
        """
