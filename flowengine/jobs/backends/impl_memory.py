"""An in-process jobboard, for tests and single-process programs.

Boards of one process with the same ``namespace`` share one store, so a
test can run a poster and several conductors in threads. Leases follow this
process's monotonic clock; events are delivered on the thread that caused
them. Nothing survives the process.

Conf: ``{'board': 'memory', 'namespace': 'x'}`` or ``'memory://?namespace=x'``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import board, lifecycle, records
from flowengine.jobs import job as job_mod
from flowengine.jobs.records import Claim, JobRecord, Outcome
from flowengine.jobs.store import Action, BoardEvent, BoardStore, EventKind, held

__all__ = ["MemoryJob", "MemoryJobBoard", "MemoryStore"]

#: Namespace used when the conf names none.
DEFAULT_NAMESPACE = "flowengine"


@dataclass
class _Entry:
    record: JobRecord
    lease_until: float | None = None  # monotonic
    not_before: float | None = None  # monotonic


@dataclass
class _Shared:
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs: dict[str, _Entry] = field(default_factory=dict)
    outcomes: dict[str, tuple[Outcome, float]] = field(default_factory=dict)
    sequence: int = 0
    token: int = 0
    subscribers: list[Callable[[BoardEvent], None]] = field(default_factory=list)
    entities: dict[str, dict[str, Any]] = field(default_factory=dict)


_REGISTRY: dict[str, _Shared] = {}
_REGISTRY_LOCK = threading.Lock()


def _shared(namespace: str) -> _Shared:
    with _REGISTRY_LOCK:
        return _REGISTRY.setdefault(namespace, _Shared())


def _wall(mono: float | None) -> float | None:
    return None if mono is None else time.time() + (mono - time.monotonic())


class MemoryStore(BoardStore):
    """A :class:`BoardStore` in this process's memory (see the module docstring)."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._shared = _shared(namespace)
        self._connected = False
        self._callbacks: list[Callable[[BoardEvent], None]] = []

    @property
    def connected(self) -> bool:
        """Whether connected."""
        return self._connected

    def connect(self) -> None:
        """Nothing to reach: just mark connected."""
        self._connected = True

    def close(self) -> None:
        """Stop delivering events to this store's subscribers."""
        self._connected = False
        with self._shared.lock:
            for cb in self._callbacks:
                if cb in self._shared.subscribers:
                    self._shared.subscribers.remove(cb)
        self._callbacks.clear()

    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver events to ``callback`` until close()."""
        with self._shared.lock:
            self._shared.subscribers.append(callback)
        self._callbacks.append(callback)

    def _emit(self, *events: BoardEvent) -> None:
        with self._shared.lock:
            subscribers = list(self._shared.subscribers)
        for event in events:
            for cb in subscribers:
                cb(event)

    def _view(self, entry: _Entry) -> JobRecord:
        now = time.monotonic()
        leased = (
            entry.record.owner is not None
            and entry.lease_until is not None
            and entry.lease_until > now
        )
        return replace(
            entry.record,
            leased=leased,
            lease_expires_at=_wall(entry.lease_until) if leased else None,
            not_before=_wall(entry.not_before),
        )

    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """Store a new job with the next sequence number."""
        with self._shared.lock:
            self._shared.sequence += 1
            record = JobRecord({**posting, "sequence": self._shared.sequence})
            self._shared.jobs[record.uuid] = _Entry(record)
        self._emit(BoardEvent(EventKind.POSTED, record.uuid))
        return record

    def listing(self) -> list[JobRecord]:
        """Every listed job."""
        with self._shared.lock:
            return [
                self._view(e)
                for e in self._shared.jobs.values()
                if e.record.where == records.LISTED
            ]

    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is, or None (a consumed one until its outcome expires)."""
        with self._shared.lock:
            entry = self._shared.jobs.get(uuid)
            if entry is not None and entry.record.where == records.CONSUMED:
                found = self._shared.outcomes.get(uuid)
                if found is None or found[1] < time.monotonic():
                    del self._shared.jobs[uuid]
                    self._shared.outcomes.pop(uuid, None)
                    return None
            return None if entry is None else self._view(entry)

    @staticmethod
    def _state(entry: _Entry, now: float) -> str:
        """Where ``entry`` is in the job machine (see flowengine.jobs.lifecycle)."""
        rec = entry.record
        if rec.where != records.LISTED:
            return {records.IN_TRASH: lifecycle.TRASHED, records.CONSUMED: lifecycle.CONSUMED}.get(
                rec.where, lifecycle.DEAD
            )
        if rec.owner is not None:
            if entry.lease_until is not None and entry.lease_until > now:
                return states.CLAIMED
            return lifecycle.advance(states.CLAIMED, "lease_ran_out")
        if entry.not_before is not None:
            if entry.not_before > now:
                return lifecycle.BACKING_OFF
            return lifecycle.advance(lifecycle.BACKING_OFF, "backoff_over")
        return states.UNCLAIMED

    def _listed(self, uuid: str, verb: str) -> _Entry:
        entry = self._shared.jobs.get(uuid)
        if entry is None or entry.record.where != records.LISTED:
            raise exc.NotFound(f"Job {uuid} not found to be {verb}")
        return entry

    def _record_outcome(
        self, entry: _Entry, outcome: str, who: str | None, reason: str | None, ttl_s: float
    ) -> Outcome:
        rec = entry.record
        done = Outcome(rec.uuid, outcome, who, rec.token, rec.attempts, time.time(), reason)
        self._shared.outcomes[rec.uuid] = (done, time.monotonic() + ttl_s)
        return done

    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """Lease the job to ``who`` (see BoardStore.claim)."""
        now = time.monotonic()
        with self._shared.lock:
            entry = self._listed(uuid, "claimed")
            view = self._view(entry)
            if view.leased:
                raise held(uuid, view.owner)
            if entry.not_before is not None and now < entry.not_before:
                raise exc.UnclaimableJob(
                    f"Job {uuid} is backing off for another {entry.not_before - now:.1f} s"
                )
            lifecycle.advance(self._state(entry, now), "claim")  # InvalidState if not
            if entry.record.attempts >= max_attempts:
                lifecycle.advance(states.UNCLAIMED, "too_many_attempts")
                entry.record = replace(entry.record, where=records.IN_DEAD_LETTER, owner=None)
                done = self._record_outcome(
                    entry, records.DEAD, None, "too many attempts", outcome_ttl_s
                )
                dead = True
            else:
                dead = False
                self._shared.token += 1
                entry.record = replace(
                    entry.record,
                    token=self._shared.token,
                    owner=who,
                    attempts=entry.record.attempts + 1,
                )
                entry.lease_until, entry.not_before = now + lease_s, None
                claim = Claim(uuid, who, self._shared.token, entry.record.attempts)
        if dead:
            self._emit(BoardEvent(EventKind.DONE, uuid, done.outcome))
            raise exc.UnclaimableJob(
                f"Job {uuid} was claimed {max_attempts} times without"
                f" finishing: moved to the dead letter"
            )
        self._emit(BoardEvent(EventKind.CLAIMED, uuid))
        return claim

    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Extend the leases still held; return the lost uuids."""
        lost = set()
        with self._shared.lock:
            for uuid, token in held:
                entry = self._shared.jobs.get(uuid)
                if (
                    entry is None
                    or entry.record.where != records.LISTED
                    or entry.record.token != token
                    or entry.record.owner is None
                ):
                    lost.add(uuid)
                else:
                    entry.lease_until = time.monotonic() + lease_s
        return lost

    def lease_remaining(self, uuid: str) -> float | None:
        """Seconds left on the current lease, or None."""
        with self._shared.lock:
            entry = self._shared.jobs.get(uuid)
            if entry is None or not self._view(entry).leased:
                return None
            return max(0.0, entry.lease_until - time.monotonic())  # type: ignore[operator]

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
        """Consume / trash / abandon / fail, fenced by ``token``."""
        verb = {Action.CONSUME: "consumed", Action.TRASH: "trashed"}.get(action, "abandoned")
        done: Outcome | None = None
        with self._shared.lock:
            entry = self._listed(uuid, verb)
            rec = entry.record
            if rec.owner is None:
                raise exc.NotFound(f"Can not {action.value} job {uuid}: nobody claimed it")
            if rec.token != token:
                raise exc.ClaimLost(
                    f"Can not {action.value} job {uuid}: claim {token} was"
                    f" superseded by claim {rec.token} of {rec.owner}"
                )
            if rec.owner != who:
                raise exc.JobFailure(
                    f"Can not {action.value} job {uuid} which is not owned"
                    f" by {who} (it is owned by {rec.owner})"
                )
            last = action is Action.FAIL and rec.attempts >= max_attempts
            lifecycle.advance(
                states.CLAIMED,
                {Action.ABANDON: "abandon", Action.CONSUME: "consume", Action.TRASH: "trash"}.get(
                    action, "fail_last_attempt" if last else "fail"
                ),
            )
            entry.lease_until = None
            if action is Action.ABANDON:
                entry.record = replace(rec, owner=None, attempts=max(0, rec.attempts - 1))
            elif action is Action.FAIL and rec.attempts < max_attempts:
                entry.record = replace(rec, owner=None)
                entry.not_before = time.monotonic() + backoff_s if backoff_s > 0 else None
            else:
                kind = {
                    Action.CONSUME: outcome or records.SUCCEEDED,
                    Action.TRASH: records.TRASHED,
                }.get(action, records.DEAD)
                done = self._record_outcome(entry, kind, who, reason, outcome_ttl_s)
                where = {Action.CONSUME: records.CONSUMED, Action.TRASH: records.IN_TRASH}.get(
                    action, records.IN_DEAD_LETTER
                )
                entry.record = replace(rec, owner=None, where=where)
        if done is None:
            self._emit(BoardEvent(EventKind.RELEASED, uuid))
        else:
            self._emit(BoardEvent(EventKind.DONE, uuid, done.outcome))
        return done

    def outcome(self, uuid: str) -> Outcome | None:
        """The recorded outcome, unless it expired."""
        with self._shared.lock:
            found = self._shared.outcomes.get(uuid)
            if found is None or found[1] < time.monotonic():
                return None
            return found[0]

    def parked(self, where: str) -> list[JobRecord]:
        """Jobs in the trash or the dead letter."""
        with self._shared.lock:
            return [self._view(e) for e in self._shared.jobs.values() if e.record.where == where]

    def requeue(self, uuid: str, max_attempts: int) -> JobRecord:
        """Back on the board from the trash or dead letter, attempts reset."""
        with self._shared.lock:
            entry = self._shared.jobs.get(uuid)
            missing = exc.NotFound(f"Job {uuid} is neither trashed nor dead-lettered")
            if entry is None:
                raise missing
            try:
                lifecycle.advance(self._state(entry, time.monotonic()), "requeue")
            except exc.InvalidState:
                raise missing from None
            entry.record = replace(entry.record, where=records.LISTED, attempts=0, owner=None)
            entry.not_before = entry.lease_until = None
            self._shared.outcomes.pop(uuid, None)
            record = self._view(entry)
        self._emit(BoardEvent(EventKind.POSTED, uuid))
        return record

    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """Remember the entity (ttl ignored: it lives as long as the process)."""
        with self._shared.lock:
            self._shared.entities[entity["name"]] = dict(entity)


class MemoryJob(job_mod.BoardJob):
    """A job on a :class:`MemoryJobBoard`."""


class MemoryJobBoard(board.LeasedJobBoard):
    """TaskFlow's jobboard API over :class:`MemoryStore` (namespace from ``conf``)."""

    JOB_CLASS = MemoryJob

    def __init__(
        self,
        name: str,
        conf: dict[str, Any],
        persistence: Any = None,
        store: MemoryStore | None = None,
    ) -> None:
        store = store or MemoryStore(str(conf.get("namespace") or DEFAULT_NAMESPACE))
        super().__init__(name, conf, store, persistence=persistence)
