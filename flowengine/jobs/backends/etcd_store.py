"""The etcd jobboard's :class:`~flowengine.jobs.store.BoardStore`: layout and transactions.

Under the board's root (``/flowengine/jobs/<path>[/<namespace>]``)::

    listed/<uuid>     {"posting": JSON text, "attempts", "owner", "token", "not_before"}
    locks/<uuid>      {"who", "lease"[, "token"]}  attached to the claimer's etcd lease
    trash/<uuid>      the job's last state plus "outcome" and "outcome_until"
    dead/<uuid>       likewise, after too many attempts
    consumed/<uuid>   likewise, kept (under an etcd lease) as long as its outcome
    entities/<kind>/<name>   a registered conductor, under a lease of its TTL

Every change is one etcd transaction whose compares pin the revisions it
read, so it applies whole or not at all. A claim writes ``listed/<uuid>``
and ``locks/<uuid>`` in one transaction: its revision is the claim's
fencing token (etcd revisions only grow), and a finish must find the job's
``mod_revision`` still equal to it. The lock lives on an etcd lease the
board's keeper keeps alive; when its owner stops renewing, etcd deletes the
lock and the job is claimable again (the watch reports RELEASED). Posting
order is the job key's ``create_revision``. Back-offs and outcome lifetimes
are on this host's clock (etcd has no clock to ask).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from flowengine import exceptions as exc
from flowengine.jobs import records
from flowengine.jobs.backends import etcd_client, etcd_events
from flowengine.jobs.backends.etcd_client import EtcdGateway, Kv
from flowengine.jobs.records import Claim, JobRecord, Outcome
from flowengine.jobs.store import (
    Action,
    BoardEvent,
    BoardStore,
    Finished,
    check_finisher,
    held,
    newest_first,
)

__all__ = ["EtcdStore"]

#: How often an operation re-reads and retries when another client changed
#: the job between its read and its transaction, before giving up.
RACE_ATTEMPTS = 8
#: Places a job leaves the board for, with its outcome.
PARKED = (records.IN_TRASH, records.IN_DEAD_LETTER, records.CONSUMED)
_WHERE = {
    Action.CONSUME: records.CONSUMED,
    Action.TRASH: records.IN_TRASH,
    Action.FAIL: records.IN_DEAD_LETTER,
}
_G = EtcdGateway


def _lock_token(lock: Kv) -> int:
    # A claim's lock is written with its job key (same revision); a lock
    # re-created by renew() after its lease lapsed names the claim's token.
    return int(lock.json().get("token") or lock.mod_revision)


class EtcdStore(BoardStore):
    """Jobs of one board under ``root`` in etcd (see the module docstring)."""

    def __init__(
        self, make_client: Callable[[], Any], root: str, where: str, owns_client: bool = True
    ) -> None:
        self._make_client = make_client
        self._root = root.rstrip("/")
        self._where = where
        self._owns_client = owns_client
        self._gw: EtcdGateway | None = None
        self._events: etcd_events.EtcdEvents | None = None

    @property
    def client(self) -> Any:
        """The ``etcd3gw`` client in use; None while not connected."""
        return self._gw.client if self._gw is not None else None

    @property
    def root(self) -> str:
        """The key prefix of this board."""
        return self._root

    def _k(self, folder: str, uuid: str = "") -> str:
        return f"{self._root}/{folder}/{uuid}"

    @property
    def _g(self) -> EtcdGateway:
        if self._gw is None:
            raise exc.JobFailure("The etcd jobboard is not connected (call connect())")
        return self._gw

    # Connection and events.

    @property
    def connected(self) -> bool:
        """Whether connect() succeeded and close() was not called since."""
        return self._gw is not None

    def connect(self) -> None:
        """Reach etcd (BoardUnavailable if it does not answer)."""
        gateway = EtcdGateway(self._make_client(), self._where)
        gateway.version()
        self._gw = gateway

    def close(self) -> None:
        """Cancel the watch; forget the client."""
        if self._events is not None:
            self._events.stop()
            self._events = None
        if self._gw is not None and self._owns_client:
            self._gw.client.session.close()
        self._gw = None

    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Watch the board's prefix (watching when this returns)."""
        if self._events is None:
            self._events = etcd_events.EtcdEvents(self._g, self._root, self._root)
            self._events.add(callback)
            if not self._events.start():
                raise exc.BoardUnavailable(f"Could not watch {self._root} on {self._where}")
        else:
            self._events.add(callback)

    # TaskFlow's key helpers (absolute keys, outside the board's layout).

    def get_one(self, key: str) -> bytes | None:
        """The raw value of ``key``; None if it does not exist."""
        _rev, (found,) = self._g.read(_G.get(key))
        return found[0].value if found else None

    def incr(self, key: str) -> int:
        """Add one to the decimal counter ``key`` (created at 1) atomically; the new value."""
        for _ in range(RACE_ATTEMPTS * 4):
            _rev, (found,) = self._g.read(_G.get(key))
            value = int(found[0].value or b"0") + 1 if found else 1
            ok, _r, _ = self._g.txn(
                [_G.revision_is(key, found[0].mod_revision if found else 0)],
                [_G.put(key, str(value))],
            )
            if ok:
                return value
        raise exc.JobFailure(f"Could not increment {key}: it kept changing under us")

    # Reading.

    def _pair(self, uuid: str) -> tuple[Kv | None, Kv | None]:
        _rev, (job, lock) = self._g.read(
            _G.get(self._k("listed", uuid)), _G.get(self._k("locks", uuid))
        )
        return (job[0] if job else None), (lock[0] if lock else None)

    @staticmethod
    def _live(job: Kv | None, lock: Kv | None) -> bool:
        """Whether the job's newest claim still holds its lease."""
        if job is None or lock is None or not job.json().get("owner"):
            return False
        return _lock_token(lock) == job.mod_revision

    def _record(self, uuid: str, job: Kv, lock: Kv | None, where: str) -> JobRecord:
        data = job.json()
        posting = records.decode_posting_fields(
            data.get("posting") or "", uuid, data.get("sequence") or job.create_revision
        )
        owner = data.get("owner")
        nb = float(data.get("not_before") or 0)
        return JobRecord(
            posting,
            attempts=int(data.get("attempts") or 0),
            token=job.mod_revision if owner else int(data.get("token") or 0),
            owner=owner,
            leased=where == records.LISTED and self._live(job, lock),
            not_before=nb if nb > time.time() else None,
            where=where,
        )

    def _records(self, where: str) -> list[JobRecord]:
        folder = "listed" if where == records.LISTED else where
        _rev, (jobs, locks) = self._g.read(
            _G.get(self._k(folder), prefix=True), _G.get(self._k("locks"), prefix=True)
        )
        lock_of = {kv.key.rsplit("/", 1)[-1]: kv for kv in locks}
        out = []
        for kv in jobs:
            uuid = kv.key.rsplit("/", 1)[-1]
            out.append(self._record(uuid, kv, lock_of.get(uuid), where))
        return out

    def listing(self) -> list[JobRecord]:
        """Every listed job (one snapshot of jobs and locks)."""
        return self._records(records.LISTED)

    def parked(self, where: str) -> list[JobRecord]:
        """Jobs in the trash or the dead letter."""
        return self._records(where)

    def finished(self, limit: int) -> list[Finished]:
        """Consumed jobs whose outcome is kept, newest first (one read of their keys)."""
        _rev, (jobs,) = self._g.read(_G.get(self._k(records.CONSUMED), prefix=True))
        found = []
        for kv in jobs:
            data = kv.json()
            # etcd deletes the key when its lease ends; the time check covers the gap.
            if data.get("outcome") and float(data.get("outcome_until") or 0) >= time.time():
                found.append(
                    (
                        self._record(kv.key.rsplit("/", 1)[-1], kv, None, records.CONSUMED),
                        Outcome.from_dict(data["outcome"]),
                    )
                )
        return newest_first(found, limit)

    def _find(self, uuid: str) -> tuple[str, Kv, Kv | None] | None:
        places = ("listed", *PARKED)
        _rev, (*found, lock) = self._g.read(
            *(_G.get(self._k(p, uuid)) for p in places), _G.get(self._k("locks", uuid))
        )
        for place, kvs in zip(places, found):
            if kvs:
                where = records.LISTED if place == "listed" else place
                return where, kvs[0], (lock[0] if lock else None)
        return None

    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is (a consumed one while its outcome is kept), or None."""
        found = self._find(uuid)
        if found is None:
            return None
        where, job, lock = found
        if where == records.CONSUMED and float(job.json().get("outcome_until") or 0) < time.time():
            return None
        return self._record(uuid, job, lock, where)

    def outcome(self, uuid: str) -> Outcome | None:
        """The recorded outcome, unless it expired."""
        found = self._find(uuid)
        if found is None or found[0] == records.LISTED:
            return None
        data = found[1].json()
        if not data.get("outcome") or float(data.get("outcome_until") or 0) < time.time():
            return None
        return Outcome.from_dict(data["outcome"])

    def lease_remaining(self, uuid: str) -> float | None:
        """Seconds left on the current claim's etcd lease, or None."""
        job, lock = self._pair(uuid)
        if lock is None or not self._live(job, lock):
            return None
        left = self._g.time_to_live(int(lock.json().get("lease") or lock.lease))
        return float(left) if left >= 0 else None

    # Posting and claiming.

    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """Create ``listed/<uuid>``; the transaction's revision is its posting order."""
        uuid = posting["uuid"]
        body = {k: v for k, v in posting.items() if k != "sequence"}
        key = self._k("listed", uuid)
        ok, revision, _ = self._g.txn(
            [_G.revision_is(key, 0)],
            [_G.put(key, {"posting": records.encode_posting(body), "attempts": 0})],
        )
        if not ok:
            raise exc.JobFailure(f"Job {uuid} could not be posted: it already exists")
        return JobRecord({**posting, "sequence": revision})

    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """Lease the job to ``who``; the claim's revision is its token (see BoardStore.claim)."""
        for _ in range(RACE_ATTEMPTS):
            job, lock = self._pair(uuid)
            if job is None:
                raise exc.NotFound(f"Job {uuid} not found to be claimed")
            data = job.json()
            if self._live(job, lock):
                raise held(uuid, data.get("owner"))
            nb = float(data.get("not_before") or 0)
            if nb > time.time():
                raise exc.UnclaimableJob(
                    f"Job {uuid} is backing off for another {nb - time.time():.1f} s"
                )
            attempts = int(data.get("attempts") or 0)
            if attempts >= max_attempts:
                token = job.mod_revision if data.get("owner") else int(data.get("token") or 0)
                dead = Outcome(
                    uuid, records.DEAD, None, token, attempts, time.time(), "too many attempts"
                )
                if self._park(uuid, job, lock, records.IN_DEAD_LETTER, dead, outcome_ttl_s):
                    raise exc.UnclaimableJob(
                        f"Job {uuid} was claimed {attempts} times without"
                        f" finishing: moved to the dead letter"
                    )
                continue
            lease = self._g.grant(lease_s)
            state = {**data, "owner": who, "attempts": attempts + 1, "not_before": 0}
            lock_key = self._k("locks", uuid)
            ok, revision, _ = self._g.txn(
                [
                    _G.revision_is(self._k("listed", uuid), job.mod_revision),
                    _G.revision_is(lock_key, lock.mod_revision if lock else 0),
                ],
                [
                    _G.put(self._k("listed", uuid), state),
                    _G.put(lock_key, {"who": who, "lease": lease}, lease=lease),
                ],
            )
            if ok:
                return Claim(uuid, who, revision, attempts + 1)
            self._g.revoke(lease)
        raise held(uuid, None)  # others kept changing it: someone is claiming it now

    def _park(
        self, uuid: str, job: Kv, lock: Kv | None, where: str, done: Outcome, outcome_ttl_s: float
    ) -> bool:
        """Move a listed job to ``where`` with its outcome; False if it changed meanwhile."""
        parked = {
            **job.json(),
            "owner": None,
            "token": done.token,
            "attempts": done.attempts,
            "sequence": job.json().get("sequence") or job.create_revision,
            "outcome": done.to_dict(),
            "outcome_until": done.at + outcome_ttl_s,
        }
        # A consumed job is kept only as long as its outcome: etcd deletes it then.
        lease = self._g.grant(outcome_ttl_s) if where == records.CONSUMED else 0
        ops = [_G.delete(self._k("listed", uuid)), _G.put(self._k(where, uuid), parked, lease)]
        if lock is not None:
            ops.append(_G.delete(self._k("locks", uuid)))
        ok, _rev, _ = self._g.txn([_G.revision_is(self._k("listed", uuid), job.mod_revision)], ops)
        if lease and not ok:
            self._g.revoke(lease)
        return ok

    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Keep every held claim's lease alive; re-lease lapsed ones nobody took; return lost."""
        if not held:
            return set()
        _rev, reads = self._g.read(
            *(
                op
                for uuid, _t in held
                for op in (_G.get(self._k("listed", uuid)), _G.get(self._k("locks", uuid)))
            )
        )
        lost: set[str] = set()
        for i, (uuid, token) in enumerate(held):
            job = reads[2 * i][0] if reads[2 * i] else None
            lock = reads[2 * i + 1][0] if reads[2 * i + 1] else None
            if job is None or not job.json().get("owner") or job.mod_revision != token:
                lost.add(uuid)  # finished, or claimed again since
                continue
            if (
                lock is not None
                and _lock_token(lock) == token
                and self._g.keepalive(int(lock.json().get("lease") or lock.lease))
            ):
                continue
            if not self._relock(uuid, job, lock, token, lease_s):
                lost.add(uuid)
        return lost

    def _relock(self, uuid: str, job: Kv, lock: Kv | None, token: int, lease_s: float) -> bool:
        """Put the claim ``token``'s lock on a new lease of ``lease_s``, if still ours."""
        lease = self._g.grant(lease_s)
        lock_key = self._k("locks", uuid)
        ok, _rev, _ = self._g.txn(
            [
                _G.revision_is(self._k("listed", uuid), token),
                _G.revision_is(lock_key, lock.mod_revision if lock else 0),
            ],
            [
                _G.put(
                    lock_key,
                    {"who": job.json()["owner"], "lease": lease, "token": token},
                    lease=lease,
                )
            ],
        )
        if not ok:
            self._g.revoke(lease)
        elif lock is not None:
            self._g.revoke(int(lock.json().get("lease") or lock.lease))
        return ok

    def extend_lease(self, uuid: str, token: int, lease_s: float) -> bool:
        """Set the claim ``token``'s lease to ``lease_s`` from now (a new etcd lease).

        Not BoardStore's renew() of one claim: renew() keeps a live etcd
        lease alive at the length it was granted with, and this one may ask
        for another length.
        """
        job, lock = self._pair(uuid)
        if job is None or not job.json().get("owner") or job.mod_revision != token:
            return False
        return self._relock(uuid, job, lock, token, lease_s)

    # Finishing.

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
        """Consume / trash / abandon / fail in one transaction fenced by ``token``."""
        for _ in range(RACE_ATTEMPTS):
            job, lock = self._pair(uuid)
            if job is None:
                raise exc.NotFound(f"Job {uuid} not found to {action.value}")
            data = job.json()
            check_finisher(action, uuid, who, token, data.get("owner"), job.mod_revision)
            attempts = int(data.get("attempts") or 0)
            if action is Action.ABANDON or (action is Action.FAIL and attempts < max_attempts):
                state = {**data, "owner": None, "token": token}
                if action is Action.ABANDON:
                    state["attempts"] = max(0, attempts - 1)
                else:
                    state["not_before"] = time.time() + backoff_s if backoff_s > 0 else 0
                ops = [_G.put(self._k("listed", uuid), state)]
                if lock is not None:
                    ops.append(_G.delete(self._k("locks", uuid)))
                ok, _rev, _ = self._g.txn([_G.revision_is(self._k("listed", uuid), token)], ops)
                if ok:
                    if lock is not None:
                        self._g.revoke(int(lock.json().get("lease") or lock.lease))
                    return None
                continue
            kind = {
                Action.CONSUME: outcome or records.SUCCEEDED,
                Action.TRASH: records.TRASHED,
            }.get(action, records.DEAD)
            done = Outcome(uuid, kind, who, token, attempts, time.time(), reason)
            if self._park(uuid, job, lock, _WHERE[action], done, outcome_ttl_s):
                if lock is not None:
                    self._g.revoke(int(lock.json().get("lease") or lock.lease))
                return done
        raise exc.JobFailure(f"Can not {action.value} job {uuid}: it kept changing under us")

    def requeue(self, uuid: str, max_attempts: int) -> JobRecord:
        """Back on the board from the trash or dead letter, attempts reset."""
        for _ in range(RACE_ATTEMPTS):
            _rev, (trashed, dead) = self._g.read(
                _G.get(self._k(records.IN_TRASH, uuid)),
                _G.get(self._k(records.IN_DEAD_LETTER, uuid)),
            )
            where, found = (
                (records.IN_TRASH, trashed[0])
                if trashed
                else (records.IN_DEAD_LETTER, dead[0])
                if dead
                else ("", None)
            )
            if found is None:
                raise exc.NotFound(f"Job {uuid} is neither trashed nor dead-lettered")
            state = {
                k: v
                for k, v in found.json().items()
                if k not in ("outcome", "outcome_until", "owner", "not_before")
            }
            state["attempts"] = 0
            ok, _r, _ = self._g.txn(
                [
                    _G.revision_is(found.key, found.mod_revision),
                    _G.revision_is(self._k("listed", uuid), 0),
                ],
                [_G.delete(found.key), _G.put(self._k("listed", uuid), state)],
            )
            if ok:
                record = self.get(uuid)
                if record is None:
                    raise exc.NotFound(f"Job {uuid} vanished right after being requeued")
                return record
        raise exc.JobFailure(f"Can not requeue job {uuid}: it kept changing under us")

    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """``entities/<kind>/<name>`` under an etcd lease of ``ttl_s``."""
        key = self._k("entities", f"{entity.get('kind') or 'entity'}/{entity['name']}")
        lease = self._g.grant(ttl_s)
        self._g.txn([], [_G.put(key, json.dumps(entity, sort_keys=True), lease=lease)])


# Re-exported for the board module's docstring and the tests.
make_client = etcd_client.make_client
