"""The job objects flowengine's boards hand out (TaskFlow's ``Job`` plus lease facts)."""

from __future__ import annotations

import datetime
import functools
import threading
from typing import TYPE_CHECKING, Any

from flowengine import states
from flowengine.jobs import base, records

if TYPE_CHECKING:  # the board module imports this one
    from flowengine.jobs.board import LeasedJobBoard

__all__ = ["BoardJob"]


def _parse_time(value: Any) -> datetime.datetime | None:
    if isinstance(value, datetime.datetime) or value is None:
        return value
    try:
        return datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return None


@functools.total_ordering
class BoardJob(base.Job):
    """A job on a :class:`~flowengine.jobs.board.LeasedJobBoard`.

    Its posting is fixed; ``state``, ``outcome`` and ``expires_in()`` ask the
    board each time. After a successful ``board.claim(job, who)`` the job
    carries that claim: ``token`` (its fencing token), ``attempt``, and
    ``lost`` (an Event set when the keeper learns the lease is gone).
    """

    def __init__(
        self,
        board: LeasedJobBoard,
        record: records.JobRecord,
        backend: Any = None,
        book: Any = None,
    ) -> None:
        posting = record.posting
        super().__init__(
            board,
            posting["name"],
            uuid=posting["uuid"],
            details=posting.get("details") or {},
            backend=backend,
            book=book,
            book_data=posting.get("book"),
        )
        self._leased = board
        self._record = record
        self._priority = base.JobPriority.convert(posting.get("priority", "NORMAL"))
        self._token = record.token
        self._attempt = record.attempts
        self.lost = threading.Event()
        #: The board's count of events when the listing that made this
        #: object was read (None if it was not made by a listing).
        self.listed_at_event: int | None = None

    # TaskFlow's abstract properties.

    @property
    def created_on(self) -> datetime.datetime | None:
        """When the job was posted (naive UTC, as TaskFlow's)."""
        return _parse_time(self._record.posting.get("created_on"))

    @property
    def last_modified(self) -> datetime.datetime | None:
        """When the posting last changed (it never does after posting)."""
        return _parse_time(self._record.posting.get("last_modified")) or self.created_on

    @property
    def state(self) -> str:
        """UNCLAIMED, CLAIMED or COMPLETE (read now; JobFailure if unreachable)."""
        return self._leased.job_state(self)

    @property
    def priority(self) -> base.JobPriority:
        """The job's priority."""
        return self._priority

    # flowengine's additions.

    @property
    def sequence(self) -> int:
        """Posting order on its board."""
        return self._record.sequence

    @property
    def record(self) -> records.JobRecord:
        """The board's view of this job when this object was made."""
        return self._record

    @property
    def token(self) -> int:
        """Fencing token of the claim this object made (or saw when read); 0 if none."""
        return self._token

    @property
    def attempt(self) -> int:
        """Which attempt the claim held through this object is (1 for the first)."""
        return self._attempt

    @property
    def outcome(self) -> records.Outcome | None:
        """How the job ended (read now), or None while it is on the board."""
        return self._leased.outcome(self)

    def _claimed(self, claim: records.Claim) -> None:
        self._token = claim.token
        self._attempt = claim.attempts
        self.lost.clear()

    def wait(self, timeout: float | None = None, *args: Any, **kwargs: Any) -> bool:
        """Block until the job left the board (True) or ``timeout`` s passed (False).

        Woken by the board's notifications (Redis pub/sub, PostgreSQL
        NOTIFY...), not by polling; TaskFlow's delay arguments are accepted
        and ignored. A job that left the board without an outcome (finished
        by a TaskFlow conductor on a ``compat='taskflow'`` board, or so long
        ago that its outcome expired) is complete too, as in TaskFlow.
        """
        if self._leased.wait_for_outcome(self, timeout) is not None:
            return True
        return self.state == states.COMPLETE

    def expires_in(self) -> float | None:
        """Seconds until the current claim's lease ends; None if not leased."""
        return self._leased.lease_remaining(self)

    def extend_expiry(self, expiry: float) -> bool:
        """Set this object's claim to expire ``expiry`` s from now; False if it is lost."""
        return self._leased.extend_lease(self, expiry)

    # Ordering (TaskFlow sorts jobs) and identity.

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, BoardJob):
            return NotImplemented
        return (self._record.sort_key(), self.uuid) < (other._record.sort_key(), other.uuid)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, BoardJob):
            return NotImplemented
        return (self._leased.name, self.uuid) == (other._board.name, other.uuid)

    def __hash__(self) -> int:
        return hash((self._leased.name, self.uuid))

    def __str__(self) -> str:
        return (
            f"{type(self).__name__}: {self.name} (priority={self.priority}, uuid="
            f"{self.uuid}, details={self._leased.masked(self.details)})"
        )

    __repr__ = __str__
