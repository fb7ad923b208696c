"""The ZooKeeper board in TaskFlow 6.5's layout (``compat='taskflow'``): the writes.

Each change is one ``multi``, made of the same operations TaskFlow's board
uses on its znodes (a claim creates ``jobN.lock``; consume deletes lock and
posting; trash moves the posting to ``.trash``), plus flowengine's: the
claim also rewrites the posting (version checked), so its ``mzxid`` is the
fencing token every finish checks. Layout and reads:
:mod:`flowengine.jobs.backends.zk_taskflow_layout`.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from typing import Any

from flowengine import exceptions as exc
from flowengine.jobs import records
from flowengine.jobs.backends.zk_store import RACE_ATTEMPTS
from flowengine.jobs.backends.zk_taskflow_layout import (
    JOB_PREFIX,
    LOCK_POSTFIX,
    SIDE,
    Found,
    TaskflowZkReader,
)
from flowengine.jobs.records import Claim, JobRecord, Outcome
from flowengine.jobs.store import Action, held

__all__ = ["TaskflowZkStore"]

_WHERE = {
    Action.CONSUME: records.CONSUMED,
    Action.TRASH: records.IN_TRASH,
    Action.FAIL: records.IN_DEAD_LETTER,
}
#: The keys of a posting TaskFlow writes (and reads) on ZooKeeper.
_POSTING_KEYS = ("uuid", "name", "priority", "details", "book")


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True).encode("utf-8")


class TaskflowZkStore(TaskflowZkReader):
    """A :class:`~flowengine.jobs.store.BoardStore` on TaskFlow's znodes."""

    def connect(self) -> None:
        """Connect (see the reader), then forget consumed jobs whose outcome expired."""
        super().connect()
        now = self._now_ms()
        folder = self._place(records.CONSUMED, "")
        with self._zk():
            names = self._client.get_children(folder)
        for name, found in zip(names, self._found([posixpath.join(folder, n) for n in names])):
            if found is not None and float((found[0] or {}).get("outcome_until") or 0) < now:
                self._client.delete_async(posixpath.join(folder, name), found[1].version)

    def _listed(self, uuid: str, action: str) -> tuple[str, dict[str, Any], Any, Found]:
        """(name, data, stat, lock) of a listed job; NotFound if it is not listed."""
        found = self._locate(uuid)
        if found is None or found[0] != records.LISTED or found[2] is None:
            raise exc.NotFound(f"Job {uuid} not found to be {action}")
        _where, name, job, lock = found
        assert job is not None  # checked above
        data, stat = job
        if data is None:
            raise exc.JobFailure(f"Job {uuid}'s posting at {self._job(name)} is unreadable")
        return name, data, stat, lock

    def _session(self) -> int | None:
        client_id = self._client.client_id
        return client_id[0] if client_id else None

    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """Create ``P/jobN`` (SEQUENTIAL) holding TaskFlow's JSON posting."""
        body = {k: posting[k] for k in _POSTING_KEYS if k in posting}
        with self._zk():
            path, stat = self._client.create(
                self._job(JOB_PREFIX), _json(body), sequence=True, include_data=True
            )
        self._observe(stat)
        name = posixpath.basename(path)
        self._names[posting["uuid"]] = name
        return JobRecord({**posting, "sequence": int(name[len(JOB_PREFIX) :])})

    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """TaskFlow's lock plus the posting rewritten in one multi (its mzxid: the token)."""
        for _ in range(RACE_ATTEMPTS):
            name, data, stat, lock = self._listed(uuid, "claimed")
            if lock is not None:
                raise held(uuid, (lock[0] or {}).get("owner"))
            side = data.get(SIDE) or {}
            now = self._now_ms()
            nb = float(side.get("not_before") or 0)
            if nb > now:
                raise exc.UnclaimableJob(
                    f"Job {uuid} is backing off for another {(nb - now) / 1000:.1f} s"
                )
            attempts = int(side.get("attempts") or 0)
            if attempts >= max_attempts:
                done = Outcome(
                    uuid,
                    records.DEAD,
                    None,
                    int(side.get("token") or 0),
                    attempts,
                    now / 1000,
                    "too many attempts",
                )
                if self._park(name, data, stat, None, records.IN_DEAD_LETTER, done, outcome_ttl_s):
                    raise exc.UnclaimableJob(
                        f"Job {uuid} was claimed {attempts} times without"
                        f" finishing: moved to the dead letter"
                    )
                continue
            claimed = {
                **data,
                SIDE: {**side, "owner": who, "attempts": attempts + 1, "not_before": 0},
            }

            def build(
                txn: Any,
                name: str = name,
                claimed: dict[str, Any] = claimed,
                version: int = stat.version,
            ) -> None:
                txn.set_data(self._job(name), _json(claimed), version)
                txn.create(self._job(name + LOCK_POSTFIX), _json({"owner": who}), ephemeral=True)

            results = self._commit(build)
            if results is not None:
                self._observe(results[0])
                return Claim(uuid, who, results[0].mzxid, attempts + 1)
        raise held(uuid, None)

    def _park(
        self,
        name: str,
        data: dict[str, Any],
        stat: Any,
        lock: Found,
        where: str,
        done: Outcome,
        outcome_ttl_s: float,
    ) -> bool:
        """Move a listed job to ``where`` with its outcome; False if it changed meanwhile."""
        until = done.at * 1000 + outcome_ttl_s * 1000
        posting = {k: v for k, v in data.items() if k != SIDE}
        if where == records.CONSUMED:
            place = self._place(where, done.uuid)
            parked = {"posting": posting, "outcome": done.to_dict(), "outcome_until": until}
        else:  # TaskFlow's trash keeps the posting; our side notes say how it ended
            place = self._place(where, name)
            parked = {
                **posting,
                SIDE: {
                    "attempts": done.attempts,
                    "token": done.token,
                    "outcome": done.to_dict(),
                    "outcome_until": until,
                },
            }

        def build(txn: Any) -> None:
            txn.create(place, _json(parked))
            if lock is not None:
                txn.delete(self._job(name + LOCK_POSTFIX), lock[1].version)
            txn.delete(self._job(name), stat.version)

        return self._commit(build) is not None

    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Check each claim (the lock of our session); re-create a lapsed one nobody took."""
        lost: set[str] = set()
        for uuid, token in held:
            name = self._names.get(uuid)
            job, lock = (
                self._found([self._job(name), self._job(name + LOCK_POSTFIX)])
                if name
                else (None, None)
            )
            side = (job[0] or {}).get(SIDE) or {} if job is not None else {}
            owner = side.get("owner")
            if job is None or not owner or job[1].mzxid != token:
                lost.add(uuid)  # finished, or claimed again since
            elif lock is not None:
                mine = (lock[0] or {}).get("owner") == owner and (
                    lock[1].ephemeralOwner == self._session()
                )
                if not mine:
                    lost.add(uuid)
            elif not self._take_back(str(name), job[1].version, owner):
                lost.add(uuid)
        return lost

    def _take_back(self, name: str, version: int, owner: str) -> bool:
        def build(txn: Any) -> None:
            txn.check(self._job(name), version)
            txn.create(self._job(name + LOCK_POSTFIX), _json({"owner": owner}), ephemeral=True)

        return self._commit(build) is not None

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
        """Consume / trash / abandon / fail as TaskFlow would, fenced by the posting's mzxid."""
        for _ in range(RACE_ATTEMPTS):
            name, data, stat, lock = self._listed(uuid, f"{action.value}ed")
            side = data.get(SIDE) or {}
            owner = side.get("owner")
            holder = (lock[0] or {}).get("owner") if lock is not None else None
            if not owner:
                if holder:
                    raise exc.JobFailure(
                        f"Can not {action.value} job {uuid} which is not"
                        f" owned by {who} (it is owned by {holder})"
                    )
                raise exc.NotFound(f"Can not {action.value} job {uuid}: nobody claimed it")
            if stat.mzxid != token:
                raise exc.ClaimLost(
                    f"Can not {action.value} job {uuid}: claim {token} was"
                    f" superseded by claim {stat.mzxid} of {owner}"
                )
            if holder is not None and holder != owner:
                raise exc.ClaimLost(
                    f"Can not {action.value} job {uuid}: claim {token} was"
                    f" superseded by a TaskFlow claim of {holder}"
                )
            if owner != who:
                raise exc.JobFailure(
                    f"Can not {action.value} job {uuid} which is not owned"
                    f" by {who} (it is owned by {owner})"
                )
            attempts = int(side.get("attempts") or 0)
            now = self._now_ms()
            if action is Action.ABANDON or (action is Action.FAIL and attempts < max_attempts):
                changes: dict[str, Any] = {"owner": None, "token": token}
                if action is Action.ABANDON:
                    changes["attempts"] = max(0, attempts - 1)
                else:
                    changes["not_before"] = now + backoff_s * 1000 if backoff_s > 0 else 0
                released = {**data, SIDE: {**side, **changes}}

                def build(
                    txn: Any,
                    name: str = name,
                    lock: Found = lock,
                    released: dict[str, Any] = released,
                    version: int = stat.version,
                ) -> None:
                    if lock is not None:
                        txn.delete(self._job(name + LOCK_POSTFIX), lock[1].version)
                    txn.set_data(self._job(name), _json(released), version)

                if self._commit(build) is not None:
                    return None
                continue
            kind = {
                Action.CONSUME: outcome or records.SUCCEEDED,
                Action.TRASH: records.TRASHED,
            }.get(action, records.DEAD)
            done = Outcome(uuid, kind, who, token, attempts, now / 1000, reason)
            if self._park(name, data, stat, lock, _WHERE[action], done, outcome_ttl_s):
                return done
        raise exc.JobFailure(f"Can not {action.value} job {uuid}: it kept changing under us")

    def requeue(self, uuid: str, max_attempts: int) -> JobRecord:
        """Post a trashed or dead-lettered job again (a new ``jobN``), attempts reset."""
        found = self._locate(uuid)
        if (
            found is None
            or found[0] not in (records.IN_TRASH, records.IN_DEAD_LETTER)
            or found[2] is None
            or found[2][0] is None
        ):
            raise exc.NotFound(f"Job {uuid} is neither trashed nor dead-lettered")
        where, name, parked, _lock = found
        assert parked is not None  # checked above
        data, stat = parked
        posting = {k: v for k, v in (data or {}).items() if k != SIDE}

        def build(txn: Any) -> None:
            txn.delete(self._place(where, name), stat.version)
            txn.create(self._job(JOB_PREFIX), _json(posting), sequence=True)

        results = self._commit(build)
        if results is None:
            raise exc.JobFailure(f"Can not requeue job {uuid}: it changed meanwhile")
        self._names[uuid] = posixpath.basename(results[1])
        record = self.get(uuid)
        if record is None:
            raise exc.NotFound(f"Job {uuid} vanished right after being requeued")
        return record

    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """An ephemeral ``.entities/<kind>/<name>``, where TaskFlow lists its conductors."""
        path = posixpath.join(
            self.entity_path, str(entity.get("kind") or "conductor"), str(entity["name"])
        )
        with self._zk():
            self._write(path, _json(entity), create_first=True, ephemeral=True, makepath=True)
