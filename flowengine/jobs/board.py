"""The jobboard every flowengine backend shares: TaskFlow's API over a :class:`BoardStore`.

Leases, fencing, attempts, dead letter, outcomes and blocking waits are
implemented here once; a backend only provides the store (see
:mod:`flowengine.jobs.store`). Configuration keys (beyond the backend's own):
``lease_s``, ``max_attempts``, ``backoff_s``, ``backoff_max_s``,
``outcome_ttl_s`` (:mod:`flowengine.jobs.policy`) and ``mask_details``
(:mod:`flowengine.jobs.masking`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import base, lease, masking, policy, records
from flowengine.jobs import job as job_mod
from flowengine.jobs.store import Action, BoardEvent, BoardStore, EventKind
from flowengine.jobs.waker import Waker

__all__ = ["LeasedJobBoard"]

LOG = logging.getLogger(__name__)

#: How long a registered entity (a conductor) stays listed without re-registering.
ENTITY_TTL_S = 3600.0

#: While the board's server is unreachable, a blocking wait reads again at
#: least this often (s) -- sooner when the store reports it reconnected.
UNREACHABLE_RETRY_S = 0.5

#: How many finished jobs :meth:`LeasedJobBoard.finished` gives by default:
#: a page's worth; outcomes are kept ``outcome_ttl_s`` (a week by default),
#: so a busy board may hold many more.
FINISHED_LIMIT = 100
_Job = job_mod.BoardJob


class LeasedJobBoard(base.NotifyingJobBoard):
    """A jobboard whose claims are fenced leases (see :mod:`flowengine.jobs.base`).

    ``persistence`` is the backend jobs' logbooks are loaded from. Operations
    on a board that is not connected raise JobFailure; an unreachable server
    raises BoardUnavailable.
    """

    #: The class of the jobs this board hands out; each board names its own
    #: (TaskFlow's names, e.g. ``RedisJob``, where TaskFlow has that board),
    #: and ``str(job)`` starts with it.
    JOB_CLASS: type[job_mod.BoardJob] = job_mod.BoardJob

    def __init__(
        self, name: str, conf: dict[str, Any], store: BoardStore, persistence: Any = None
    ) -> None:
        super().__init__(name, conf)
        self._store = store
        self._persistence = persistence
        self.policy = policy.BoardPolicy.from_conf(conf)
        self.masked = masking.masker(conf.get("mask_details"))
        self._waker = Waker()
        self._lost_handlers: dict[str, list[Callable[[Any], None]]] = {}
        self._claimed: dict[str, _Job] = {}
        self._lock = threading.Lock()
        # Hints for claimers: which jobs were claimed or left the board at
        # which count of events (see taken_since_listed).
        self._events_seen = 0
        self._taken: dict[str, int] = {}
        self._gone: set[str] = set()
        # A claim to make with the next consume, and claims so made that
        # their claimer has not taken up yet (see claim_with_next_consume).
        self._next_claim: tuple[_Job, str] | None = None
        self._prefetched: dict[str, tuple[_Job, records.Claim]] = {}
        self._keeper = lease.LeaseKeeper(
            lambda held, s: self._store.renew(held, s),
            self.policy.lease_s,
            self.policy.renew_every_s,
            self._on_lost,
            name,
        )

    # Connection.

    @property
    def connected(self) -> bool:
        """Whether the board is connected."""
        return self._store.connected

    def connect(self) -> None:
        """Connect (reconnect) to the server and start receiving its events."""
        self._store.close()
        self._store.connect()
        self._store.subscribe(self._on_event)

    def close(self) -> None:
        """Stop renewing leases (they run out on the server) and disconnect."""
        self._keeper.stop()
        self._store.close()
        self._waker.notify()  # waiters re-check and see the board closed

    def _store_op(self) -> BoardStore:
        if not self._store.connected:
            raise exc.JobFailure(f"Jobboard {self.name!r} is not connected (call connect())")
        return self._store

    # Events.

    def _on_event(self, event: BoardEvent) -> None:
        self._note_taken(event)
        if event.kind is EventKind.CLAIMED:
            return  # a claim makes no work available: nobody to wake
        self._waker.notify()
        if event.kind is EventKind.POSTED and event.uuid:
            self.notifier.notify(base.POSTED, {"job_uuid": event.uuid})
        elif event.kind is EventKind.DONE and event.uuid:
            with self._lock:
                job = self._claimed.get(event.uuid)
            self.notifier.notify(
                base.REMOVAL, {"job": job, "job_uuid": event.uuid, "outcome": event.outcome}
            )

    def _note_taken(self, event: BoardEvent) -> None:
        with self._lock:
            self._events_seen += 1
            # (A gap in delivery, RESYNC, may leave a hint stale: harmless, a
            # hint only skips a job until the next listing.)
            uuid = event.uuid
            if uuid is None:
                pass
            elif event.kind is EventKind.DONE:
                self._taken[uuid] = self._events_seen
                self._gone.add(uuid)
            elif event.kind is EventKind.CLAIMED:
                self._taken[uuid] = self._events_seen
            elif event.kind is EventKind.POSTED or uuid not in self._gone:
                # Posted again (requeued), or given back: claimable. (A
                # finish deletes the lease too: RELEASED does not undo DONE.)
                self._taken.pop(uuid, None)
                self._gone.discard(uuid)

    def taken_since_listed(self, job: base.Job) -> bool:
        """Whether an event said ``job`` was claimed or left the board after it was listed.

        A hint, never a refusal: a claimer skips such a job for now (a claim
        would most likely be refused) and finds it in a later listing if it
        was given back. Always False for a job that did not come from
        :meth:`listing` or :meth:`iterjobs`, and on stores that do not
        send CLAIMED events the claims of others go unseen.
        """
        mark = getattr(job, "listed_at_event", None)
        if mark is None:
            return False
        with self._lock:
            if job.uuid in self._claimed:
                return False  # (our own claim's event)
            seen = self._taken.get(job.uuid)
        return seen is not None and seen > mark

    @property
    def change_seq(self) -> int:
        """A counter of board events seen; pass it to :meth:`wait_for_change`."""
        return self._waker.seq

    def wait_for_change(self, seen: int, timeout: float | None) -> bool:
        """Block until an event arrives after ``seen`` (True) or ``timeout`` s (False)."""
        return self._waker.wait(seen, timeout)

    def wake(self) -> None:
        """Wake every waiter of this board object now (e.g. a conductor's stop)."""
        self._waker.notify()

    # Reading.

    def _job(self, record: records.JobRecord) -> _Job:
        return self.JOB_CLASS(self, record, backend=self._persistence)

    def _fetch_jobs(self, ensure_fresh: bool = False) -> list[_Job]:
        with self._lock:
            mark = self._events_seen
            # Hints older than this listing are in it already: drop them.
            self._taken = {u: n for u, n in self._taken.items() if n > mark}
            self._gone.intersection_update(self._taken)
        jobs = sorted(self._job(r) for r in self._store_op().listing())
        for job in jobs:
            job.listed_at_event = mark
        return jobs

    def iterjobs(
        self, only_unclaimed: bool = False, ensure_fresh: bool = False
    ) -> base.JobBoardIterator:
        """Listed jobs, most urgent then oldest first (each state re-read as you go)."""
        return base.JobBoardIterator(
            self,
            LOG,
            board_fetch_func=self._fetch_jobs,
            only_unclaimed=only_unclaimed,
            ensure_fresh=ensure_fresh,
        )

    def listing(self) -> list[_Job]:
        """Listed jobs with the state they had when read (one round trip, no re-reads)."""
        return self._fetch_jobs()

    def wait(self, timeout: float | None = None) -> base.JobBoardIterator:
        """Block until jobs are listed: an iterator over them (NotFound after ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self._waker.seq
            jobs = self._fetch_jobs()
            if jobs:
                return base.JobBoardIterator(
                    self, LOG, board_fetch_func=lambda _jobs=jobs, **_: _jobs
                )
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise exc.NotFound(f"Expired waiting for jobs to arrive; waited {timeout} s")
            self._waker.wait(seen, left)

    @property
    def job_count(self) -> int:
        """How many jobs are listed now."""
        return self._store_op().count()

    def get_job(self, uuid: str) -> _Job:
        """The job ``uuid`` wherever it is (listed, trash, dead letter); NotFound if unknown."""
        record = self._store_op().get(uuid)
        if record is None:
            raise exc.NotFound(f"No job {uuid} on board {self.name!r}")
        return self._job(record)

    def job_state(self, job: base.Job) -> str:
        """UNCLAIMED / CLAIMED while listed, COMPLETE once it left the board."""
        record = self._store_op().get(job.uuid)
        if record is None or record.where != records.LISTED:
            return states.COMPLETE
        return states.CLAIMED if record.leased else states.UNCLAIMED

    def find_owner(self, job: base.Job) -> str | None:
        """Who holds a live claim on the job; None if nobody (or the job is gone)."""
        record = self._store_op().get(job.uuid)
        if record is None or record.where != records.LISTED or not record.leased:
            return None
        return record.owner

    def outcome(self, job: base.Job | str) -> records.Outcome | None:
        """How the job ended, or None while it is listed (or its outcome expired)."""
        return self._store_op().outcome(job if isinstance(job, str) else job.uuid)

    def wait_for_outcome(
        self, job: base.Job | str, timeout: float | None = None
    ) -> records.Outcome | None:
        """Block until the job has an outcome (returned) or ``timeout`` s (None).

        A board server that is unreachable for a while (restarting, a
        ZooKeeper session being replaced) does not end the wait: it raises
        BoardUnavailable only if the server is still unreachable when
        ``timeout`` runs out.
        """
        uuid = job if isinstance(job, str) else job.uuid
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self._waker.seq
            retry_in: float | None = None
            try:
                found = self.outcome(uuid)
                if found is not None:
                    return found
                if self._store.get(uuid) is None:
                    return None  # unknown, or finished so long ago its outcome expired
            except exc.BoardUnavailable:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                retry_in = UNREACHABLE_RETRY_S
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if retry_in is not None:
                left = retry_in if left is None else min(left, retry_in)
            self._waker.wait(seen, left)

    def lease_remaining(self, job: base.Job) -> float | None:
        """Seconds until the job's current lease ends (None if not leased)."""
        return self._store_op().lease_remaining(job.uuid)

    # Posting and claiming.

    def post(
        self,
        name: str,
        book: Any = None,
        details: dict[str, Any] | None = None,
        priority: Any = base.JobPriority.NORMAL,
    ) -> _Job:
        """Post a job (details must be JSON-serialisable); returns it."""
        from flowengine.persistence import models

        prio = base.JobPriority.convert(priority).value
        posting = records.new_posting(models.generate_uuid(), name, details, book, prio)
        records.encode_posting(posting)  # JobFailure now, before anything is stored
        record = self._store_op().post(posting, self.policy.max_attempts)
        LOG.debug(
            "Posted job %s (%s) on board %s: %s",
            record.uuid,
            name,
            self.name,
            self.masked(details or {}),
        )
        return self.JOB_CLASS(self, record, backend=self._persistence, book=book)

    @base.check_who
    def claim(self, job: base.Job, who: str, expiry: float | None = None) -> None:
        """Claim ``job`` for ``who`` under a lease and a fresh fencing token.

        Without ``expiry`` the lease is ``lease_s`` and this board's keeper
        renews it until consume/abandon/trash; with ``expiry`` (seconds, as
        TaskFlow's Redis board) it simply runs out unless ``extend_expiry``
        is called. UnclaimableJob if held, backing off or dead-lettered;
        NotFound if the job is not on the board.
        """
        if expiry is not None and not float(expiry) > 0:
            raise ValueError(f"Provided expiry must be greater than zero, not {expiry!r}")
        if self._take_up(job, who, expiry):
            return
        lease_s = self.policy.lease_s if expiry is None else float(expiry)
        claim = self._store_op().claim(
            job.uuid, who, lease_s, self.policy.max_attempts, self.policy.outcome_ttl_s
        )
        if isinstance(job, _Job):
            self._record_claim(job, claim)
        if expiry is None:
            self._keeper.hold(job.uuid, claim.token)
        LOG.debug(
            "Job %s claimed by %s (token %d, attempt %d)",
            job.uuid,
            who,
            claim.token,
            claim.attempts,
        )

    def claim_with_next_consume(self, job: base.Job | None, who: str) -> None:
        """Let ``who``'s next consume also claim ``job``, in the same write where the store can.

        A conductor that knows which job it takes next asks this before
        running the current one: on ZooKeeper the consume and the claim are
        then one transaction (one round trip, one durable write, instead of
        two). The claim, if made, is held (leased, renewed) from then on and
        handed over by the next :meth:`claim` of ``job`` by ``who``; one not
        taken up must be given back with :meth:`drop_next_claim`. Only one
        such request is kept; any finish by ``who`` clears it, and so does
        ``job=None``.
        """
        with self._lock:
            self._next_claim = (job, who) if isinstance(job, _Job) else None

    def drop_next_claim(self, who: str) -> None:
        """Cancel :meth:`claim_with_next_consume`; give back a job it claimed and nobody took up."""
        with self._lock:
            if self._next_claim is not None and self._next_claim[1] == who:
                self._next_claim = None
            left = [j for j, c in self._prefetched.values() if c.who == who]
            for job in left:
                self._prefetched.pop(job.uuid, None)
        for job in left:
            try:
                self._finish(job, who, Action.ABANDON, reason="claimed ahead, not taken up")
            except (exc.JobFailure, exc.NotFound) as e:  # its lease runs out instead
                LOG.warning("Could not give back job %s claimed ahead: %s", job.uuid, e)

    def _take_up(self, job: base.Job, who: str, expiry: float | None) -> bool:
        """Hand over a claim made ahead with a consume (True), if there is one for this claim."""
        with self._lock:
            ahead = self._prefetched.pop(job.uuid, None)
        if ahead is None:
            return False
        if ahead[1].who != who or expiry is not None:
            with self._lock:
                self._prefetched[job.uuid] = ahead  # not this claim's: given back later
            return False
        if isinstance(job, _Job) and job is not ahead[0]:
            self._record_claim(job, ahead[1])
        return True

    def _record_claim(self, job: _Job, claim: records.Claim, ahead: bool = False) -> None:
        """Remember ``job`` as claimed under ``claim``.

        ``ahead``: claimed with a consume, to be handed over by the next
        :meth:`claim` (in the same lock hold, so that a loss reported
        meanwhile drops both records).
        """
        job._claimed(claim)
        with self._lock:
            self._claimed[job.uuid] = job
            if ahead:
                self._prefetched[job.uuid] = (job, claim)

    def extend_lease(self, job: base.Job, expiry: float) -> bool:
        """Set the job's claim to end ``expiry`` s from now; False if it is lost."""
        return self._store_op().extend_lease(job.uuid, self._token_of(job), float(expiry))

    def on_claim_lost(self, job: base.Job, callback: Callable[[Any], None]) -> None:
        """Call ``callback(job)`` (keeper thread) if the job's lease turns out lost."""
        with self._lock:
            self._lost_handlers.setdefault(job.uuid, []).append(callback)

    def _on_lost(self, uuid: str, token: int) -> None:
        with self._lock:
            job = self._claimed.pop(uuid, None)
            handlers = self._lost_handlers.pop(uuid, [])
            self._prefetched.pop(uuid, None)  # claimed ahead, lost before taken up
        LOG.warning(
            "Lost the claim on job %s (token %d): its lease ran out and it was"
            " claimed again; its engine stops and its writes are refused",
            uuid,
            token,
        )
        if job is not None:
            job.lost.set()
        for handler in handlers:
            handler(job)

    def held_jobs(self) -> list[_Job]:
        """The jobs this board object holds claims on (renewed by its keeper)."""
        held = self._keeper.held()
        with self._lock:
            return [j for u, j in self._claimed.items() if u in held]

    # Finishing (fenced).

    def _token_of(self, job: base.Job) -> int:
        token = getattr(job, "token", 0)
        if not token:
            record = self._store_op().get(job.uuid)
            token = record.token if record is not None else 0
        return token

    def _finish(
        self, job: base.Job, who: str, action: Action, **kwargs: Any
    ) -> records.Outcome | None:
        token = self._token_of(job)
        with self._lock:
            ahead, self._next_claim = self._next_claim, None
        with self._keeper.settling(job.uuid):
            try:
                if action is Action.CONSUME and ahead is not None and ahead[1] == who:
                    done = self._consume_and_claim(job, who, token, ahead[0], **kwargs)
                else:
                    done = self._store_op().finish(
                        job.uuid,
                        who,
                        token,
                        action,
                        max_attempts=self.policy.max_attempts,
                        outcome_ttl_s=self.policy.outcome_ttl_s,
                        **kwargs,
                    )
            except (exc.ClaimLost, exc.NotFound):
                self._forget(job.uuid, token)  # not ours any more: stop renewing it
                raise
            self._forget(job.uuid, token)
        return done

    def _consume_and_claim(
        self, job: base.Job, who: str, token: int, then: _Job, **kwargs: Any
    ) -> records.Outcome | None:
        done, claim = self._store_op().consume_and_claim(
            job.uuid,
            who,
            token,
            then.uuid,
            outcome=kwargs.get("outcome") or records.SUCCEEDED,
            reason=kwargs.get("reason"),
            lease_s=self.policy.lease_s,
            max_attempts=self.policy.max_attempts,
            outcome_ttl_s=self.policy.outcome_ttl_s,
        )
        if claim is not None:
            self._record_claim(then, claim, ahead=True)
            self._keeper.hold(then.uuid, claim.token)
            LOG.debug(
                "Job %s claimed by %s with the consume of %s (token %d, attempt %d)",
                then.uuid,
                who,
                job.uuid,
                claim.token,
                claim.attempts,
            )
        return done

    def _forget(self, uuid: str, token: int) -> None:
        self._keeper.release(uuid, token)
        with self._lock:
            self._lost_handlers.pop(uuid, None)
            self._claimed.pop(uuid, None)
            self._prefetched.pop(uuid, None)

    @base.check_who
    def consume(
        self, job: base.Job, who: str, outcome: str = records.SUCCEEDED, reason: str | None = None
    ) -> None:
        """Remove the claimed job, recording ``outcome``; ClaimLost if superseded."""
        if outcome not in (records.SUCCEEDED, records.REVERTED, records.FAILED):
            raise ValueError(
                f"A consumed job's outcome is succeeded, reverted or failed, not {outcome!r}"
            )
        self._finish(job, who, Action.CONSUME, outcome=outcome, reason=reason)

    @base.check_who
    def abandon(
        self, job: base.Job, who: str, failed: bool = False, reason: str | None = None
    ) -> records.Outcome | None:
        """Give the claimed job back; ``failed=True`` counts the attempt and backs off.

        After a failed last attempt the job goes to the dead letter: its
        Outcome (DEAD) is returned then, None otherwise. ClaimLost if
        superseded, NotFound if it is not claimed.
        """
        if not failed:
            return self._finish(job, who, Action.ABANDON, reason=reason)
        attempt = getattr(job, "attempt", 0) or 1
        return self._finish(
            job, who, Action.FAIL, reason=reason, backoff_s=self.policy.backoff_for(attempt)
        )

    @base.check_who
    def trash(self, job: base.Job, who: str, reason: str | None = None) -> None:
        """Move the claimed job to the trash (outcome trashed); ClaimLost if superseded."""
        self._finish(job, who, Action.TRASH, outcome=records.TRASHED, reason=reason)

    # Trash and dead letter.

    def dead_letters(self) -> list[_Job]:
        """Jobs given up after ``max_attempts`` claims."""
        return sorted(self._job(r) for r in self._store_op().parked(records.IN_DEAD_LETTER))

    def trashed(self) -> list[_Job]:
        """Jobs in the trash."""
        return sorted(self._job(r) for r in self._store_op().parked(records.IN_TRASH))

    def finished(self, limit: int = FINISHED_LIMIT) -> list[tuple[_Job, records.Outcome]]:
        """Consumed jobs whose outcome is still kept, with it; newest first, at most ``limit``.

        A consumed job (succeeded, reverted, failed) leaves the listing and
        is kept ``outcome_ttl_s`` after it finished, then forgotten. Jobs
        TaskFlow's own conductors consumed on a ``compat='taskflow'`` board
        leave no record, so they are never among them.
        """
        return [(self._job(rec), done) for rec, done in self._store_op().finished(limit)]

    def requeue(self, job: base.Job | str) -> _Job:
        """Post a dead-lettered or trashed job again (same uuid, attempts reset)."""
        uuid = job if isinstance(job, str) else job.uuid
        return self._job(self._store_op().requeue(uuid, self.policy.max_attempts))

    def register_entity(self, entity: Any) -> None:
        """Record an entity (conductor) as using this board, for ENTITY_TTL_S."""
        self._store_op().register_entity(entity.to_dict(), ENTITY_TTL_S)
