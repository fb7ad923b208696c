"""Jobs and jobboards: TaskFlow's API (``taskflow.jobs.base``), and the backend contract.

A *poster* saves a logbook and posts a :class:`Job` naming it on a
:class:`JobBoard`; *conductors* on any number of hosts claim jobs, run their
flows in engines loaded from persistence, then consume (or abandon, or
trash) them. The classes here are TaskFlow's by name and signature, so code
written against ``taskflow.jobs`` runs unchanged.

What flowengine adds, on every board it ships (see :mod:`flowengine.jobs.board`):

* every claim is a **lease** (:data:`flowengine.jobs.policy.LEASE_S`),
  renewed by one keeper thread per board; a claimer that dies loses its
  claims within the lease;
* each claim carries a **fencing token**, a number that grows with every
  claim on the board; consume/abandon/trash with an older token are refused
  (:class:`~flowengine.exceptions.ClaimLost`), and so are persistence writes
  made under it (:mod:`flowengine.persistence.fencing`);
* attempts are counted, failed ones back off, and a job claimed
  ``max_attempts`` times without finishing goes to the **dead letter**;
* the **outcome** (succeeded, reverted, failed, trashed, dead) is recorded,
  and :meth:`Job.wait` blocks on the board's notifications instead of polling.

The backend contract
--------------------

A board backend is one module under :mod:`flowengine.jobs.backends` that
subclasses :class:`flowengine.jobs.board.LeasedJobBoard` and gives it a
:class:`flowengine.jobs.store.BoardStore`. The board does everything that is
the same everywhere (TaskFlow's API, jobs, the lease keeper, back-off policy,
notifier, masking, waiting); the store does what needs the server, each
operation **atomic** on the server (a Lua script, one SQL transaction, one
ZooKeeper multi-op):

``post(posting)``
    store a new job, assign its posting ``sequence``.
``claim(uuid, who, lease_s, max_attempts)``
    if the job is listed, not leased, and past its back-off: draw the next
    **board-wide** token, count an attempt, lease it to ``who``; past
    ``max_attempts`` move it to the dead letter instead.
``renew(held, lease_s)``
    extend many leases in one round trip, each only if its token still holds
    the job; return the uuids that were lost.
``finish(uuid, who, token, action, ...)``
    consume / trash / abandon / fail, each **fenced**: refused unless
    ``token`` is the job's newest claim; records the outcome.
``listing()``, ``get(uuid)``, ``outcome(uuid)``, ``parked(where)``, ``requeue(uuid)``
    reads, and putting a dead-lettered or trashed job back.
``subscribe(callback)``
    deliver board events (posted, released, done) to ``callback`` from a
    thread of the store's own, with a ``RESYNC`` event whenever delivery may
    have had a gap (reconnection); never a polling loop.

Server time, not the claimer's clock, decides when a lease ends, so clock
skew between conductors cannot make two of them hold one job.

The ZooKeeper backend (:mod:`flowengine.jobs.backends.zk_store`) fits the
same contract: a claim is one ``multi`` that rewrites the job's znode
(version checked) and creates an ephemeral lease znode, the token is that
transaction's zxid (ZooKeeper's transaction ids grow across the whole
ensemble), renewals rewrite the lease znodes (the server's ``mtime`` is
the lease clock), ``finish`` is one ``multi`` guarded by the job znode's
version, and children watches feed ``subscribe``.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import enum
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from flowengine import exceptions as excp
from flowengine import states
from flowengine.types import notifier

__all__ = [
    "POSTED",
    "REMOVAL",
    "Job",
    "JobBoard",
    "JobBoardIterator",
    "JobPriority",
    "NotifyingJobBoard",
    "check_who",
    "format_posting",
]

#: Jobboard notifier events (TaskFlow's): a job was posted / removed.
POSTED = "POSTED"
REMOVAL = "REMOVAL"


class JobPriority(enum.Enum):
    """How urgent a job is; higher ones are offered to claimers first."""

    VERY_HIGH = "VERY_HIGH"
    HIGH = "HIGH"
    NORMAL = "NORMAL"
    LOW = "LOW"
    VERY_LOW = "VERY_LOW"

    @classmethod
    def convert(cls, value: Any) -> JobPriority:
        """The priority named by ``value`` (any case); ValueError naming the valid ones."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            valid = [p.value for p in cls]
            raise ValueError(
                f"'{value}' is not a valid priority, valid priorities are {valid}"
            ) from None

    @property
    def rank(self) -> int:
        """0 for VERY_HIGH ... 4 for VERY_LOW (sort key)."""
        return list(type(self)).index(self)

    @classmethod
    def reorder(cls, *values: tuple[Any, Any]) -> Any:
        """``(priority, value)`` pairs -> the values, most urgent first (stable)."""
        if not values:
            raise ValueError("At least one (priority, value) pair is required")
        ranked = sorted(((cls.convert(p).rank, i, v) for i, (p, v) in enumerate(values)))
        ordered = tuple(v for _rank, _i, v in ranked)
        return ordered[0] if len(ordered) == 1 else ordered


class Job(abc.ABC):
    """A named unit of work on a board: a logbook, details, an owner, a state.

    Only one entity owns (has claimed) a job at a time; if it fails, the job
    goes back on the board for another to resume from the persisted logbook.
    """

    def __init__(
        self,
        board: Any,
        name: str,
        uuid: str | None = None,
        details: dict[str, Any] | None = None,
        backend: Any = None,
        book: Any = None,
        book_data: dict[str, Any] | None = None,
    ) -> None:
        from flowengine.persistence import models

        self._uuid = uuid or models.generate_uuid()
        self._name = name
        self._details = details or {}
        self._backend = backend
        self._board = board
        self._book = book
        self._book_data = book_data or {}

    @property
    @abc.abstractmethod
    def last_modified(self) -> Any:
        """The datetime the job was last modified."""

    @property
    @abc.abstractmethod
    def created_on(self) -> Any:
        """The datetime the job was created on."""

    @property
    @abc.abstractmethod
    def state(self) -> str:
        """UNCLAIMED, CLAIMED or COMPLETE (read from the board now)."""

    @property
    @abc.abstractmethod
    def priority(self) -> JobPriority:
        """The :class:`JobPriority` of this job."""

    @property
    def board(self) -> Any:
        """The board this job was posted on or read from."""
        return self._board

    def wait(
        self,
        timeout: float | None = None,
        delay: float = 0.01,
        delay_multiplier: float = 2.0,
        max_delay: float = 60.0,
        sleep_func: Callable[[float], Any] = time.sleep,
    ) -> bool:
        """Wait until the job is COMPLETE: True, or False after ``timeout`` seconds.

        This generic version checks with a growing delay (TaskFlow's); the
        boards flowengine ships override it with a blocking wait.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.state == states.COMPLETE:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            sleep_func(delay if left is None else min(delay, left))
            delay = min(delay * delay_multiplier, max_delay)

    @property
    def book(self) -> Any:
        """The job's logbook (loaded from the board's persistence), or None."""
        if self._book is None:
            self._book = self._load_book()
        return self._book

    @property
    def book_uuid(self) -> str | None:
        """Uuid of the job's logbook, or None."""
        return self._book.uuid if self._book is not None else self._book_data.get("uuid")

    @property
    def book_name(self) -> str | None:
        """Name of the job's logbook, or None."""
        return self._book.name if self._book is not None else self._book_data.get("name")

    @property
    def uuid(self) -> str:
        """The uuid of this job."""
        return self._uuid

    @property
    def details(self) -> dict[str, Any]:
        """The details posted with this job (``flow_uuid``, ``store``...)."""
        return self._details

    @property
    def name(self) -> str:
        """The (not unique) name of this job."""
        return self._name

    def _load_book(self) -> Any:
        if self._backend is None or self.book_uuid is None:
            return None
        with contextlib.closing(self._backend.get_connection()) as conn:
            return conn.get_logbook(self.book_uuid)

    def __str__(self) -> str:
        return (
            f"{type(self).__name__}: {self.name} (priority={self.priority},"
            f" uuid={self.uuid}, details={self.details})"
        )


class JobBoardIterator:
    """Iterates over a board's jobs, fetched once, skipping those gone meanwhile.

    Attributes: ``only_unclaimed``, ``ensure_fresh``, ``board``.
    """

    _UNCLAIMED_JOB_STATES = (states.UNCLAIMED,)
    _JOB_STATES = (states.UNCLAIMED, states.COMPLETE, states.CLAIMED)

    def __init__(
        self,
        board: Any,
        logger: logging.Logger,
        board_fetch_func: Callable[..., Any] | None = None,
        board_removal_func: Callable[[Any], Any] | None = None,
        only_unclaimed: bool = False,
        ensure_fresh: bool = False,
    ) -> None:
        self._board = board
        self._logger = logger
        self._fetch = board_fetch_func
        self._remove = board_removal_func
        self._fetched = False
        self._jobs: collections.deque[Job] = collections.deque()
        self.only_unclaimed = only_unclaimed
        self.ensure_fresh = ensure_fresh

    @property
    def board(self) -> Any:
        """The board this iterator was created from."""
        return self._board

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if not self._fetched:
            self._fetched = True
            if self._fetch is not None:
                self._jobs.extend(self._fetch(ensure_fresh=self.ensure_fresh))
        allowed = self._UNCLAIMED_JOB_STATES if self.only_unclaimed else self._JOB_STATES
        while self._jobs:
            job = self._jobs.popleft()
            try:
                if job.state in allowed:
                    return job
            except excp.NotFound:
                if self._remove is not None:
                    self._remove(job)
            except excp.JobFailure:
                self._logger.warning("Failed determining the state of job '%s'", job, exc_info=True)
        raise StopIteration


class JobBoard(abc.ABC):
    """A place where jobs are posted, claimed, and consumed/abandoned/trashed."""

    def __init__(self, name: str, conf: dict[str, Any]) -> None:
        self._name = name
        self._conf = conf

    @property
    def name(self) -> str:
        """The (not unique) name of this board."""
        return self._name

    @abc.abstractmethod
    def iterjobs(self, only_unclaimed: bool = False, ensure_fresh: bool = False) -> Any:
        """An iterator over the jobs on the board (most urgent, then oldest, first)."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> Any:
        """Wait until the board has jobs; an iterator over them (NotFound on timeout)."""

    @property
    @abc.abstractmethod
    def job_count(self) -> int:
        """How many jobs are on the board now (claimed or not)."""

    @abc.abstractmethod
    def find_owner(self, job: Job) -> str | None:
        """Who holds the job's claim (None if nobody does)."""

    @abc.abstractmethod
    def consume(self, job: Job, who: str) -> None:
        """Remove a job its claimer finished (NotFound / JobFailure otherwise)."""

    @abc.abstractmethod
    def post(
        self,
        name: str,
        book: Any = None,
        details: dict[str, Any] | None = None,
        priority: Any = JobPriority.NORMAL,
    ) -> Job:
        """Create and post a job; returns it."""

    @abc.abstractmethod
    def claim(self, job: Job, who: str) -> None:
        """Claim a job (UnclaimableJob if someone holds it, NotFound if gone)."""

    @abc.abstractmethod
    def abandon(self, job: Job, who: str) -> None:
        """Give a claimed job back so others may claim it."""

    @abc.abstractmethod
    def trash(self, job: Job, who: str) -> None:
        """Move a claimed job to the trash: never claimed again, kept for review."""

    @abc.abstractmethod
    def register_entity(self, entity: Any) -> None:
        """Record an entity (a conductor) as using this board."""

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """Whether the board is connected."""

    @abc.abstractmethod
    def connect(self) -> None:
        """Connect to the board's server."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect; the board can be connected again later."""


class NotifyingJobBoard(JobBoard):
    """A board with a ``notifier`` emitting at least POSTED and REMOVAL.

    Callbacks may run on another thread than the one that changed the board.
    """

    def __init__(self, name: str, conf: dict[str, Any]) -> None:
        super().__init__(name, conf)
        self.notifier = notifier.Notifier()


def check_who(meth: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: ``who`` must be a non-empty string (TypeError / ValueError)."""

    @functools.wraps(meth)
    def wrapper(self: Any, job: Any, who: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(who, str):
            raise TypeError("Job applicant must be a string type")
        if not who:
            raise ValueError("Job applicant must be non-empty")
        return meth(self, job, who, *args, **kwargs)

    return wrapper


def format_posting(
    uuid: str,
    name: str,
    created_on: Any = None,
    last_modified: Any = None,
    details: dict[str, Any] | None = None,
    book: Any = None,
    priority: JobPriority = JobPriority.NORMAL,
) -> dict[str, Any]:
    """The dict a board stores for a new job (TaskFlow's shape)."""
    posting: dict[str, Any] = {
        "uuid": uuid,
        "name": name,
        "priority": priority.value,
        "details": details or {},
    }
    if created_on is not None:
        posting["created_on"] = created_on
    if last_modified is not None:
        posting["last_modified"] = last_modified
    if book is not None:
        posting["book"] = {"name": book.name, "uuid": book.uuid}
    return posting
