"""The ZooKeeper jobboard's store, reading half: layout, plumbing, clock, reads, events.

The writing half (each change one ``multi`` transaction) is
:class:`flowengine.jobs.backends.impl_zookeeper.ZkStore`.

Layout under the board's path (``<path>[/<namespace>]``)::

    listed/<uuid>     a listed job: its posting and claim state (JSON); the
                      znode's version guards every change, its creation
                      zxid is the job's posting order
    leases/<uuid>     the live claim: an EPHEMERAL znode {who, token, lease_ms}
                      whose mtime is its last renewal (server clock)
    trash/<uuid>, dead/<uuid>, consumed/<uuid>
                      parked and finished jobs, with their outcome
    entities/<kind>/<name>   registered entities (ephemeral)
    clock             touched to read the server's clock

Fencing tokens are ZooKeeper transaction ids: a claim is one ``multi`` that
rewrites ``listed/<uuid>`` (its version checked) and creates the lease, so
the job's ``mzxid`` after it *is* the claim's zxid, which grows across the
whole ensemble with every write. Nothing else writes a claimed job's znode
until its claim ends, so "the token is the job's newest claim" is "the
token is the job's mzxid", checked atomically by a version check in the
finishing ``multi``.

A lease ends when its claimer stops renewing it (mtime + lease_ms is past,
on the server's clock, read from the mtime of our own writes) or at once
when its claimer's session ends (the ephemeral znode goes, and the leases
watch wakes every conductor). A lease that ran out while nobody claimed the
job since is taken back by the next renewal, as on the other boards.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from flowengine.utils import kazoo_tls, kazoo_utils, optional

try:
    from kazoo import exceptions as k_exc
    from kazoo.client import KazooClient
    from kazoo.interfaces import IAsyncResult
    from kazoo.protocol.states import ZnodeStat
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

from flowengine import exceptions as exc
from flowengine.jobs import records
from flowengine.jobs.backends import zk_events, zk_known
from flowengine.jobs.records import JobRecord, Outcome
from flowengine.jobs.store import BoardEvent, BoardStore, Finished, newest_first

__all__ = ["OP_TIMEOUT_S", "RACE_ATTEMPTS", "ZkReader"]

#: Bound on one request's round trip: a server that does not answer fails
#: the call (BoardUnavailable; the lease keeper retries) instead of hanging
#: a conductor. A reconnecting client answers well within it.
OP_TIMEOUT_S = 10.0
#: How long connect() waits for a session.
CONNECT_TIMEOUT_S = 15.0
#: A claim or finish retried after its multi lost a race (another claimer
#: changed the job in between); more than this and the job is "being claimed".
RACE_ATTEMPTS = 5
#: Folders of the jobs that left the listing (named as records' ``where``).
PARKED = (records.IN_TRASH, records.IN_DEAD_LETTER, records.CONSUMED)
#: A znode read: its JSON object and stat, or None when it does not exist.
Read = zk_known.Read


class ZkReader(BoardStore):
    """The reads of a :class:`BoardStore` in one ZooKeeper ensemble (see the module docstring).

    Subclassed by the writing half; not a complete store on its own.
    """

    def __init__(
        self,
        client: KazooClient,
        path: str,
        owns_client: bool,
        check_compatible: bool = True,
        where: str = "",
    ) -> None:
        self._client = client
        self._where = where or str(client.hosts)
        self.path = path
        self._owns = owns_client
        self._check = check_compatible
        self._events: zk_events.ZkEvents | None = None
        self._connected = False
        self._offset_ms = 0.0  # server clock minus this host's, from our writes' mtimes
        self._lock = threading.Lock()
        # The listed jobs as last read or written: claims and finishes start from them.
        self._known = zk_known.KnownJobs()

    def _p(self, *parts: str) -> str:
        return posixpath.join(self.path, *parts)

    # Plumbing.

    @contextmanager
    def _zk(self) -> Iterator[None]:
        try:
            yield
        except (
            k_exc.ConnectionLoss,
            k_exc.SessionExpiredError,
            k_exc.OperationTimeoutError,
            k_exc.ZookeeperStoppedError,
            self._client.handler.timeout_exception,
        ) as e:
            raise exc.BoardUnavailable(
                f"ZooKeeper at {self._where} is unreachable: {type(e).__name__} {e}", cause=e
            ) from e
        except (k_exc.KazooException, k_exc.ZookeeperError) as e:
            raise exc.JobFailure(
                f"ZooKeeper at {self._where} failed: {type(e).__name__} {e}", cause=e
            ) from e

    def _wait(self, result: IAsyncResult) -> Any:
        with self._zk():
            return result.get(timeout=OP_TIMEOUT_S)

    def _reads(self, paths: Sequence[str]) -> list[Read]:
        """Each znode's JSON and stat (None where missing), all requests in flight at once."""
        pending = [self._client.get_async(p) for p in paths]
        out: list[Read] = []
        for path, result in zip(paths, pending):
            try:
                data, stat = self._wait(result)
            except exc.JobFailure as e:
                if isinstance(e.cause, k_exc.NoNodeError):
                    out.append(None)
                    continue
                raise
            out.append((self._decode(path, data), stat))
        return out

    @staticmethod
    def _decode(path: str, data: bytes) -> dict[str, Any]:
        try:
            value = json.loads(data.decode("utf-8")) if data else {}
        except (UnicodeDecodeError, ValueError) as e:
            raise exc.JobFailure(f"Znode {path} does not hold JSON ({e}): {data[:200]!r}") from e
        if not isinstance(value, dict):
            raise exc.JobFailure(f"Znode {path} must hold a JSON object: {data[:200]!r}")
        return value

    @staticmethod
    def _encode(value: dict[str, Any]) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def _commit(self, build: Callable[[Any], None]) -> list[Any] | None:
        """Run one multi; its results, or None if a check in it failed (a lost race)."""
        txn = self._client.transaction()
        build(txn)
        results: list[Any] = self._wait(txn.commit_async())
        failures = [
            r
            for r in results
            if isinstance(r, k_exc.KazooException)
            and not isinstance(r, (k_exc.RolledBackError, k_exc.RuntimeInconsistency))
        ]
        if failures:
            if all(
                isinstance(r, (k_exc.BadVersionError, k_exc.NodeExistsError, k_exc.NoNodeError))
                for r in failures
            ):
                return None
            raise exc.JobFailure(f"ZooKeeper transaction on {self.path} failed: {failures}")
        return results

    def _write(
        self, path: str, data: bytes, create_first: bool = False, **create: Any
    ) -> ZnodeStat:
        """Set ``path`` to ``data``, creating it if missing; the znode's stat.

        Race-free against other clients doing the same at the same moment: a
        create that finds the znode made meanwhile sets it instead, a set that
        finds it deleted meanwhile creates it (``create``: kazoo's create
        options). Call within :meth:`_zk`.
        """
        for _ in range(RACE_ATTEMPTS):
            if not create_first:
                try:
                    stat: ZnodeStat = self._client.set(path, data)
                    return stat
                except k_exc.NoNodeError:
                    pass
            create_first = False
            try:
                made: ZnodeStat = self._client.create(path, data, include_data=True, **create)[1]
                return made
            except k_exc.NodeExistsError:
                continue  # another client made it first: set it next round
        raise exc.JobFailure(f"Znode {path} kept appearing and vanishing: could not write it")

    def _observe(self, stat: ZnodeStat) -> None:
        """Learn the server's clock from the mtime of a write we just made."""
        self._offset_ms = stat.mtime - time.time() * 1000.0

    def _now_ms(self) -> float:
        return time.time() * 1000.0 + self._offset_ms

    def _host_s(self, server_ms: float) -> float:
        return (server_ms - self._offset_ms) / 1000.0

    # Connection and events.

    @property
    def connected(self) -> bool:
        """Whether connect() succeeded and close() was not called since."""
        return self._connected

    def _start_client(self) -> None:
        """Start the session unless it runs; JobFailure at once for TLS settings that cannot work.

        (Not BoardUnavailable: a wrong CA or certificate does not go away by retrying.)
        """
        if self._client.connected:
            return
        problem = kazoo_tls.tls_problem(self._client)
        if problem is not None:
            raise exc.JobFailure(problem)
        kazoo_utils.start_or_await(self._client, CONNECT_TIMEOUT_S)  # it may be reconnecting

    def connect(self) -> None:
        """Start the session, check the server, create the layout, read the server's clock."""
        with self._zk():
            self._start_client()
            if self._check:
                kazoo_utils.check_compatible(self._client, (3, 4, 0))
            for part in ("listed", "leases", *PARKED, "entities"):
                self._client.ensure_path(self._p(part))
            self._observe(self._write(self._p("clock"), b""))
        self._connected = True
        self._reap_outcomes()

    def _reap_outcomes(self) -> None:
        """Forget consumed jobs whose outcome expired (as the SQL board does on connect)."""
        now = self._now_ms()
        where = self._p(records.CONSUMED)
        names = self._wait(self._client.get_children_async(where))
        for name, read in zip(names, self._reads([posixpath.join(where, n) for n in names])):
            if read is not None and float(read[0].get("outcome_until") or 0) < now:
                self._client.delete_async(posixpath.join(where, name), read[1].version)

    def close(self) -> None:
        """Stop the events; stop the client if this store made it."""
        self._connected = False
        if self._events is not None:
            self._events.stop()
            self._events = None
        if self._owns:
            kazoo_utils.finalize_client(self._client)

    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver the watches' events to ``callback`` (armed when this returns)."""
        if self._events is None:
            self._events = zk_events.ZkEvents(
                self._client, self._p("listed"), self._p("leases"), self.path
            )
            self._events.add(callback)
            with self._zk():
                self._events.start()
        else:
            self._events.add(callback)

    # Reading.

    def _lease_of(self, job: Read, lease: Read) -> tuple[bool, float | None]:
        """(live, end in server ms) of the current claim of a listed job."""
        if job is None or lease is None or not job[0].get("owner"):
            return False, None
        data, stat = lease
        if int(data.get("token") or stat.czxid) != job[1].mzxid:
            return False, None  # a leftover of an older claim
        ends = stat.mtime + float(data.get("lease_ms") or 0)
        return ends > self._now_ms(), ends

    def _record(self, uuid: str, job: Read, lease: Read, where: str) -> JobRecord:
        assert job is not None
        data, stat = job
        posting = records.decode_posting_fields(
            data.get("posting") or "", uuid, data.get("sequence") or stat.czxid
        )
        owner = data.get("owner")
        live, ends = self._lease_of(job, lease) if where == records.LISTED else (False, None)
        nb = float(data.get("not_before") or 0)
        return JobRecord(
            posting,
            attempts=int(data.get("attempts") or 0),
            token=stat.mzxid if owner else int(data.get("token") or 0),
            owner=owner,
            leased=live,
            lease_expires_at=self._host_s(ends) if live and ends else None,
            not_before=self._host_s(nb) if nb > self._now_ms() else None,
            where=where,
        )

    def _records(self, where: str) -> list[JobRecord]:
        folder = self._p(where)
        names = sorted(self._wait(self._client.get_children_async(folder)))
        jobs = self._reads([posixpath.join(folder, n) for n in names])
        leases: list[Read] = [None] * len(names)
        if where == records.LISTED:
            # Only a claimed job has a lease (a claim creates it with the owner,
            # every end of a claim deletes it with the owner): read just those.
            owned = [i for i, j in enumerate(jobs) if j is not None and j[0].get("owner")]
            for i, read in zip(owned, self._reads([self._p("leases", names[i]) for i in owned])):
                leases[i] = read
            self._known.listed(
                {n: (j, le) for n, j, le in zip(names, jobs, leases) if j is not None}
            )
        return [
            self._record(n, j, le, where) for n, j, le in zip(names, jobs, leases) if j is not None
        ]  # gone between the listing and the read

    def listing(self) -> list[JobRecord]:
        """Every listed job."""
        return self._records(records.LISTED)

    def count(self) -> int:
        """How many jobs are listed."""
        return len(self._wait(self._client.get_children_async(self._p("listed"))))

    def parked(self, where: str) -> list[JobRecord]:
        """Jobs in the trash or the dead letter."""
        return self._records(where)

    def finished(self, limit: int) -> list[Finished]:
        """Consumed jobs whose outcome is kept, newest first (their znodes hold both)."""
        folder = self._p(records.CONSUMED)
        names = sorted(self._wait(self._client.get_children_async(folder)))
        now = self._now_ms()
        found = []
        for name, read in zip(names, self._reads([posixpath.join(folder, n) for n in names])):
            if read is None or not read[0].get("outcome"):
                continue  # gone between the listing and the read
            if float(read[0].get("outcome_until") or 0) >= now:
                found.append(
                    (
                        self._record(name, read, None, records.CONSUMED),
                        Outcome.from_dict(read[0]["outcome"]),
                    )
                )
        return newest_first(found, limit)

    def _find(self, uuid: str) -> tuple[str, Read, Read] | None:
        places = (records.LISTED, *PARKED)
        *found, lease = self._reads([*(self._p(w, uuid) for w in places), self._p("leases", uuid)])
        for where, read in zip(places, found):
            if read is not None:
                return where, read, lease
        return None

    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is (a consumed one while its outcome is kept), or None."""
        found = self._find(uuid)
        if found is None:
            return None
        where, job, lease = found
        if (
            where == records.CONSUMED
            and job is not None
            and (float(job[0].get("outcome_until") or 0) < self._now_ms())
        ):
            return None
        return self._record(uuid, job, lease, where)

    def outcome(self, uuid: str) -> Outcome | None:
        """The recorded outcome, unless it expired."""
        for read in self._reads([self._p(w, uuid) for w in PARKED]):
            if read is not None and read[0].get("outcome"):
                if float(read[0].get("outcome_until") or 0) < self._now_ms():
                    return None
                return Outcome.from_dict(read[0]["outcome"])
        return None

    def lease_remaining(self, uuid: str) -> float | None:
        """Seconds left on the current lease, or None."""
        job, lease = self._reads([self._p("listed", uuid), self._p("leases", uuid)])
        live, ends = self._lease_of(job, lease)
        return (ends - self._now_ms()) / 1000.0 if live and ends else None
