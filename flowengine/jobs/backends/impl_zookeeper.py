"""The ZooKeeper jobboard (TaskFlow's ``ZookeeperJobBoard`` name and configuration keys).

Every change is one ZooKeeper ``multi`` transaction guarded by the job
znode's version; leases are ephemeral znodes renewed by the board's keeper
(and gone with their claimer's session); fencing tokens are the zxids of
the claiming transactions; wake-ups come from watches. The layout and the
reasoning are in :mod:`flowengine.jobs.backends.zk_store`.

Configuration: a URL (``zookeeper://h1:2181,h2:2181/path?namespace=x``) or
TaskFlow's keys ``hosts``, ``path`` (default ``/flowengine/jobs``: not
TaskFlow's ``/taskflow/jobs``, whose layout differs), ``timeout`` (the
session timeout, seconds; default the lease), ``check_compatible`` and
the client keys of :func:`flowengine.utils.kazoo_utils.make_client`; plus
``namespace`` (a sub-path, as the other boards' namespaces) and the policy
keys every board takes (:mod:`flowengine.jobs.board`). Needs the
``zookeeper`` extra and ZooKeeper 3.4 or newer. ``compat='taskflow'``
switches to TaskFlow 6.5's ``jobNNN`` / ``jobNNN.lock`` znodes under its
path (:mod:`.zk_taskflow_layout`), to share a board with TaskFlow's conductors.
"""

from __future__ import annotations

import functools
import json
import posixpath
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from flowengine.utils import kazoo_utils, optional

try:
    from kazoo import exceptions as k_exc
    from kazoo.client import KazooClient
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

from flowengine import exceptions as exc
from flowengine.jobs import board, policy, records
from flowengine.jobs import job as job_mod
from flowengine.jobs.backends import compat
from flowengine.jobs.backends.zk_known import Seen, created_stat
from flowengine.jobs.backends.zk_store import RACE_ATTEMPTS, Read, ZkReader
from flowengine.jobs.records import Claim, JobRecord, Outcome
from flowengine.jobs.store import Action, check_finisher, held

__all__ = ["DEFAULT_PATH", "ZkStore", "ZookeeperJob", "ZookeeperJobBoard"]

#: Where jobs live when the configuration names no path.
DEFAULT_PATH = "/flowengine/jobs"
#: Shortest session timeout a board asks for when its lease is shorter: kazoo
#: pings every third of it, and below 2 s a loaded host loses its session
#: (and so its leases) to a scheduling hiccup.
MIN_SESSION_S = 2.0
_WHERE = {
    Action.CONSUME: records.CONSUMED,
    Action.TRASH: records.IN_TRASH,
    Action.FAIL: records.IN_DEAD_LETTER,
}


class ZkStore(ZkReader):
    """A :class:`~flowengine.jobs.store.BoardStore` in ZooKeeper: the reads plus the writes."""

    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """Create ``listed/<uuid>``; its creation zxid is the posting order."""
        uuid = posting["uuid"]
        body = dict(posting)
        body.pop("sequence", None)
        data = self._encode({"posting": records.encode_posting(body), "attempts": 0})
        try:
            with self._zk():
                _path, stat = self._client.create(self._p("listed", uuid), data, include_data=True)
        except exc.JobFailure as e:
            if isinstance(e.cause, k_exc.NodeExistsError):
                raise exc.JobFailure(f"Job {uuid} could not be posted: it already exists") from e
            raise
        self._observe(stat)
        return JobRecord({**posting, "sequence": stat.czxid})

    @staticmethod
    def _state(job: Read, **changes: Any) -> dict[str, Any]:
        assert job is not None
        data, stat = job
        return {**data, "sequence": data.get("sequence") or stat.czxid, **changes}

    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """Lease the job to ``who``; the claim's zxid is its token (see BoardStore.claim).

        Tried first on the job as last listed (no read: the multi's version
        check tells if it changed since); read afresh after that.
        """
        usable = functools.partial(self._claimable, uuid, max_attempts=max_attempts)
        for job, lease in self._tries(uuid, usable):
            if job is None:
                raise exc.NotFound(f"Job {uuid} not found to be claimed")
            data, stat = job
            live, _ends = self._lease_of(job, lease)
            if live:
                raise held(uuid, data.get("owner"))
            now = self._now_ms()
            nb = float(data.get("not_before") or 0)
            if nb > now:
                raise exc.UnclaimableJob(
                    f"Job {uuid} is backing off for another {(nb - now) / 1000:.1f} s"
                )
            attempts = int(data.get("attempts") or 0)
            if attempts >= max_attempts:
                token = stat.mzxid if data.get("owner") else int(data.get("token") or 0)
                done = Outcome(
                    uuid, records.DEAD, None, token, attempts, now / 1000, "too many attempts"
                )
                if self._park(uuid, job, lease, records.IN_DEAD_LETTER, done, outcome_ttl_s):
                    raise exc.UnclaimableJob(
                        f"Job {uuid} was claimed {attempts} times without"
                        f" finishing: moved to the dead letter"
                    )
                continue
            state = self._state(job, owner=who, attempts=attempts + 1, not_before=0)
            lease_data = {"who": who, "token": 0, "lease_ms": int(lease_s * 1000)}

            def build(
                txn: Any,
                lease: Read = lease,
                state: dict[str, Any] = state,
                version: int = stat.version,
                lease_data: dict[str, Any] = lease_data,
            ) -> None:
                if lease is not None:  # a lapsed lease: ours replaces it
                    txn.delete(self._p("leases", uuid), lease[1].version)
                txn.set_data(self._p("listed", uuid), self._encode(state), version)
                txn.create(self._p("leases", uuid), self._encode(lease_data), ephemeral=True)

            results = self._commit(build)
            if results is not None:
                new_stat = results[1 if lease is not None else 0]
                self._observe(new_stat)
                lease_stat = created_stat(
                    new_stat, len(self._encode(lease_data)), (self._client.client_id or (0, b""))[0]
                )
                self._known.remember(uuid, (state, new_stat), (lease_data, lease_stat))
                return Claim(uuid, who, new_stat.mzxid, attempts + 1)
        raise held(uuid, None)  # others kept changing it: someone is claiming it now

    def _tries(self, uuid: str, usable: Callable[[Read, Read], bool]) -> Iterator[Seen]:
        """The job and its lease to try a guarded write on, first without a read.

        First as this store last saw them, if ``usable`` says a write of
        that state would not be refused (a refusal is decided on a fresh
        read only); then read afresh, RACE_ATTEMPTS times at most.
        """
        remembered = self._known.recall(uuid)
        if remembered is not None and usable(*remembered):
            yield remembered
        for _ in range(RACE_ATTEMPTS):
            job, lease = self._reads([self._p("listed", uuid), self._p("leases", uuid)])
            yield job, lease

    def _claimable(self, uuid: str, job: Read, lease: Read, max_attempts: int) -> bool:
        """Whether a claim of the job as read would be written (not refused)."""
        if job is None or self._lease_of(job, lease)[0]:
            return False
        if lease is None and job[0].get("owner") is None:
            # Seen unclaimed; if the leases watch saw a lease appear since,
            # another board claimed it: read (and refuse) instead of sending
            # a multi bound to fail (a failed multi is still a logged write).
            leased = self._events.leased() if self._events is not None else None
            if leased is not None and uuid in leased:
                return False
        data = job[0]
        if float(data.get("not_before") or 0) > self._now_ms():
            return False
        return int(data.get("attempts") or 0) < max_attempts

    def _park(
        self, uuid: str, job: Read, lease: Read, where: str, done: Outcome, outcome_ttl_s: float
    ) -> bool:
        """Move a listed job to ``where`` with its outcome; False if it changed meanwhile."""
        assert job is not None
        parked = self._state(
            job,
            owner=None,
            token=done.token,
            attempts=done.attempts,
            outcome=done.to_dict(),
            outcome_until=done.at * 1000 + outcome_ttl_s * 1000,
        )

        def build(txn: Any) -> None:
            if lease is not None:
                txn.delete(self._p("leases", uuid), lease[1].version)
            txn.delete(self._p("listed", uuid), job[1].version)
            txn.create(self._p(where, uuid), self._encode(parked))

        if self._commit(build) is None:
            return False
        self._known.forget(uuid)
        return True

    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Touch every held lease (all at once); take back lapsed ones; return the lost."""
        if not held:
            return set()
        uuids = [u for u, _t in held]
        reads = self._reads(
            [p for u in uuids for p in (self._p("listed", u), self._p("leases", u))]
        )
        lost: set[str] = set()
        touches = []
        bodies: dict[str, bytes] = {}
        for i, (uuid, token) in enumerate(held):
            job, lease = reads[2 * i], reads[2 * i + 1]
            if job is None or not job[0].get("owner") or job[1].mzxid != token:
                lost.add(uuid)  # finished, or claimed again since
                continue
            mine = lease is not None and int(lease[0].get("token") or lease[1].czxid) == token
            body = self._encode(
                {"who": job[0]["owner"], "token": token, "lease_ms": int(lease_s * 1000)}
            )
            if mine and lease is not None:
                bodies[uuid] = body
                touches.append(
                    (uuid, self._client.set_async(self._p("leases", uuid), body, lease[1].version))
                )
            else:
                self._known.forget(uuid)  # its lease is re-created (or it is lost)
                if not self._take_back(uuid, job, lease, body):
                    lost.add(uuid)
        tokens = dict(held)
        for uuid, result in touches:
            try:
                stat = self._wait(result)
                self._observe(stat)
                self._known.renewed(uuid, tokens[uuid], (json.loads(bodies[uuid]), stat))
            except exc.JobFailure as e:
                if isinstance(e, exc.BoardUnavailable):
                    raise
                # Deleted or replaced by a claimer meanwhile; or touched by
                # another renewal of ours (the keeper's, and an
                # extend_lease(), both retrying after a reconnect): then the
                # version moved but the lease is still this claim's.
                if not self._still_held(uuid, tokens[uuid]):
                    lost.add(uuid)
        return lost

    def _still_held(self, uuid: str, token: int) -> bool:
        """Whether the claim ``token`` still owns the job and its (live) lease znode."""
        job, lease = self._reads([self._p("listed", uuid), self._p("leases", uuid)])
        if job is None or not job[0].get("owner") or job[1].mzxid != token or lease is None:
            return False
        return int(lease[0].get("token") or lease[1].czxid) == token

    def _take_back(self, uuid: str, job: Read, lease: Read, body: bytes) -> bool:
        """Re-create the lease of a claim nobody superseded (its session ended, or it lapsed)."""
        assert job is not None

        def build(txn: Any) -> None:
            if lease is not None:
                txn.delete(self._p("leases", uuid), lease[1].version)
            txn.check(self._p("listed", uuid), job[1].version)
            txn.create(self._p("leases", uuid), body, ephemeral=True)

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
        """Consume / trash / abandon / fail in one multi, fenced by the job's version.

        Tried first on the job as our claim (or latest renewal) left it, with
        no read; read afresh if that is refused or the multi's checks fail.
        """
        usable = functools.partial(self._finishable, who=who, token=token)
        for job, lease in self._tries(uuid, usable):
            if job is None:
                raise exc.NotFound(f"Job {uuid} not found to {action.value}")
            data, stat = job
            check_finisher(action, uuid, who, token, data.get("owner"), stat.mzxid)
            attempts = int(data.get("attempts") or 0)
            now = self._now_ms()
            if action is Action.ABANDON or (action is Action.FAIL and attempts < max_attempts):
                changes: dict[str, Any] = {"owner": None, "token": token}
                if action is Action.ABANDON:
                    changes["attempts"] = max(0, attempts - 1)
                else:
                    changes["not_before"] = now + backoff_s * 1000 if backoff_s > 0 else 0
                state = self._state(job, **changes)

                def build(
                    txn: Any,
                    lease: Read = lease,
                    state: dict[str, Any] = state,
                    version: int = stat.version,
                ) -> None:
                    if lease is not None:
                        txn.delete(self._p("leases", uuid), lease[1].version)
                    txn.set_data(self._p("listed", uuid), self._encode(state), version)

                if self._commit(build) is not None:
                    self._known.forget(uuid)
                    return None
                continue
            kind = {
                Action.CONSUME: outcome or records.SUCCEEDED,
                Action.TRASH: records.TRASHED,
            }.get(action, records.DEAD)
            done = Outcome(uuid, kind, who, token, attempts, now / 1000, reason)
            if self._park(uuid, job, lease, _WHERE[action], done, outcome_ttl_s):
                return done
        raise exc.JobFailure(f"Can not {action.value} job {uuid}: it kept changing under us")

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
        """Consume and claim the next job in ONE multi (one round trip, one fsync for both).

        Built from both jobs as remembered (no read); if either changed
        since, the multi's version checks refuse the whole of it and the
        consume is done alone, as :meth:`finish` does it (see BoardStore).
        """
        both = self._consume_and_claim_ops(
            uuid, who, token, next_uuid, outcome, reason, lease_s, max_attempts, outcome_ttl_s
        )
        if both is not None:
            return both
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

    def _consume_and_claim_ops(
        self,
        uuid: str,
        who: str,
        token: int,
        next_uuid: str,
        outcome: str,
        reason: str | None,
        lease_s: float,
        max_attempts: int,
        outcome_ttl_s: float,
    ) -> tuple[Outcome, Claim] | None:
        """The combined multi, if both remembered states allow it and it went through."""
        mine, then = self._known.recall(uuid), self._known.recall(next_uuid)
        if mine is None or then is None or uuid == next_uuid:
            return None
        if not self._finishable(*mine, who=who, token=token):
            return None
        if not self._claimable(next_uuid, *then, max_attempts=max_attempts):
            return None
        job, lease = mine
        next_job, next_lease = then
        assert job is not None and lease is not None and next_job is not None
        attempts = int(job[0].get("attempts") or 0)
        now = self._now_ms()
        done = Outcome(uuid, outcome, who, token, attempts, now / 1000, reason)
        parked = self._state(
            job,
            owner=None,
            token=token,
            attempts=attempts,
            outcome=done.to_dict(),
            outcome_until=done.at * 1000 + outcome_ttl_s * 1000,
        )
        next_attempts = int(next_job[0].get("attempts") or 0) + 1
        state = self._state(next_job, owner=who, attempts=next_attempts, not_before=0)
        lease_data = {"who": who, "token": 0, "lease_ms": int(lease_s * 1000)}

        def build(txn: Any) -> None:
            txn.delete(self._p("leases", uuid), lease[1].version)
            txn.delete(self._p("listed", uuid), job[1].version)
            txn.create(self._p(records.CONSUMED, uuid), self._encode(parked))
            if next_lease is not None:  # a lapsed lease: ours replaces it
                txn.delete(self._p("leases", next_uuid), next_lease[1].version)
            txn.set_data(self._p("listed", next_uuid), self._encode(state), next_job[1].version)
            txn.create(self._p("leases", next_uuid), self._encode(lease_data), ephemeral=True)

        results = self._commit(build)
        if results is None:
            return None
        self._known.forget(uuid)
        new_stat = results[4 if next_lease is not None else 3]
        self._observe(new_stat)
        lease_stat = created_stat(
            new_stat, len(self._encode(lease_data)), (self._client.client_id or (0, b""))[0]
        )
        self._known.remember(next_uuid, (state, new_stat), (lease_data, lease_stat))
        return done, Claim(next_uuid, who, new_stat.mzxid, next_attempts)

    @staticmethod
    def _finishable(job: Read, lease: Read, who: str, token: int) -> bool:
        """Whether the job as remembered is held by ``who``'s claim ``token``, lease and all."""
        if job is None or lease is None:
            return False  # (a finish must delete a lease it knows of, not leave it behind)
        return job[0].get("owner") == who and job[1].mzxid == token

    def requeue(self, uuid: str, max_attempts: int) -> JobRecord:
        """Back on the board from the trash or dead letter, attempts reset."""
        for _ in range(RACE_ATTEMPTS):
            trashed, dead = self._reads(
                [self._p(records.IN_TRASH, uuid), self._p(records.IN_DEAD_LETTER, uuid)]
            )
            where, found = (
                (records.IN_TRASH, trashed)
                if trashed is not None
                else (records.IN_DEAD_LETTER, dead)
            )
            if found is None:
                raise exc.NotFound(f"Job {uuid} is neither trashed nor dead-lettered")
            state = {
                k: v
                for k, v in self._state(found).items()
                if k not in ("outcome", "outcome_until", "owner", "not_before")
            }
            state["attempts"] = 0

            def build(
                txn: Any, where: str = where, found: Read = found, state: dict[str, Any] = state
            ) -> None:
                assert found is not None
                txn.delete(self._p(where, uuid), found[1].version)
                txn.create(self._p("listed", uuid), self._encode(state))

            if self._commit(build) is not None:
                record = self.get(uuid)
                if record is None:
                    raise exc.NotFound(f"Job {uuid} vanished right after being requeued")
                return record
        raise exc.JobFailure(f"Can not requeue job {uuid}: it kept changing under us")

    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """An ephemeral ``entities/<kind>/<name>``: listed while this board's session lives."""
        path = self._p("entities", str(entity.get("kind") or "entity"), str(entity["name"]))
        body = json.dumps(entity, sort_keys=True).encode("utf-8")
        with self._zk():
            self._write(path, body, create_first=True, ephemeral=True, makepath=True)


class ZookeeperJob(job_mod.BoardJob):
    """A job on a :class:`ZookeeperJobBoard` (TaskFlow's class name)."""


class ZookeeperJobBoard(board.LeasedJobBoard):
    """A jobboard in ZooKeeper with leased, fenced claims (see the module docstring).

    ``client``: an existing kazoo client (started or not; not stopped by
    close()); ``persistence``: where logbooks are loaded from. ValueError
    for a relative path.
    """

    #: Oldest ZooKeeper server accepted (TaskFlow's value): multi transactions.
    MIN_ZK_VERSION = (3, 4, 0)
    JOB_CLASS = ZookeeperJob
    #: TaskFlow's names of its folders. flowengine's layout differs (see
    #: :mod:`.zk_store`): these name the matching places in it.
    LOCK_POSTFIX = ".lock"
    TRASH_FOLDER = records.IN_TRASH
    ENTITY_FOLDER = "entities"

    def __init__(
        self,
        name: str,
        conf: dict[str, Any],
        client: KazooClient | None = None,
        persistence: Any = None,
        emit_notifications: bool = True,
    ) -> None:
        conf = dict(conf)
        url = conf.get("url") or conf.get("board")
        if isinstance(url, str) and url.lower().startswith("zookeeper:"):
            conf = kazoo_utils.conf_from_url(url, conf)
        layout = compat.board_layout(conf)
        path = str(conf.get("path") or (layout.default_zk_path if layout else DEFAULT_PATH))
        if not posixpath.isabs(path):
            raise ValueError(f"Zookeeper path must be absolute, not {path!r}")
        if conf.get("namespace"):
            path = posixpath.join(path, str(conf["namespace"]))
        if client is None:
            # A paused claimer's session (and its leases) ends about when its lease does.
            conf.setdefault(
                "timeout", max(MIN_SESSION_S, policy.BoardPolicy.from_conf(conf).lease_s)
            )
        check = str(conf.get("check_compatible", True)).strip().lower()
        store_class: Any = layout.zk_store() if layout else ZkStore
        store = store_class(
            client if client is not None else kazoo_utils.make_client(conf),
            path,
            owns_client=client is None,
            check_compatible=check in ("1", "t", "true", "on", "y", "yes"),
            where=""
            if client is not None
            else str(kazoo_utils.parse_hosts(conf.get("hosts", kazoo_utils.DEFAULT_HOSTS))),
        )
        super().__init__(name, conf, store, persistence=persistence)
        self._path = path

    @property
    def path(self) -> str:
        """The znode every job of this board lives under."""
        return self._path

    @property
    def trash_path(self) -> str:
        """Where trashed jobs are kept."""
        return posixpath.join(self._path, self.TRASH_FOLDER)

    @property
    def entity_path(self) -> str:
        """Where registered entities are listed."""
        return posixpath.join(self._path, self.ENTITY_FOLDER)
