"""The ZooKeeper board in TaskFlow 6.5's own layout (``compat='taskflow'``): layout and reads.

The writes are :class:`flowengine.jobs.backends.zk_taskflow_store.TaskflowZkStore`.

TaskFlow's znodes, under its path ``P`` (``/taskflow/jobs`` by default)::

    P/jobNNNNNNNNNN        a posting (JSON), created SEQUENTIAL: its number orders jobs
    P/jobNNNNNNNNNN.lock   the claim: EPHEMERAL, {"owner": name}
    <parent of P>/.trash/jobNNNNNNNNNN    trashed postings
    <parent of P>/.entities/<kind>/<name> registered conductors (ephemeral)

flowengine adds a ``"flowengine"`` object inside a posting (attempts,
owner, back-off; TaskFlow reads only its own keys of a posting, and copies
the rest into its trash) and keeps the dead letter and consumed jobs'
outcomes in ``<parent of P>/.flowengine-<basename of P>/{dead,done}``.

What holds: a claim is TaskFlow's lock, so it lasts as long as the
claimer's ZooKeeper *session* (TaskFlow's lease; the board's session
timeout defaults to ``lease_s``). flowengine's claim also rewrites the
posting in the same ``multi``, so the posting's ``mzxid`` is the claim's
fencing token, checked by every finish; TaskFlow's own claims only check
the posting, and carry no token. Every wake-up comes from a watch on
``P``, TaskFlow's changes included.
"""

from __future__ import annotations

import datetime
import logging
import posixpath
from collections.abc import Callable, Sequence
from typing import Any

from flowengine.utils import kazoo_utils, optional

try:
    from kazoo import exceptions as k_exc
    from kazoo.protocol.states import ZnodeStat
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

from flowengine import exceptions as exc
from flowengine.jobs import records
from flowengine.jobs.backends import zk_events
from flowengine.jobs.backends.zk_store import ZkReader
from flowengine.jobs.records import JobRecord, Outcome
from flowengine.jobs.store import BoardEvent, Finished, newest_first

__all__ = [
    "JOB_PREFIX",
    "LOCK_POSTFIX",
    "SIDE",
    "Found",
    "TaskflowZkEvents",
    "TaskflowZkReader",
    "iso_time",
]

LOG = logging.getLogger(__name__)

JOB_PREFIX, LOCK_POSTFIX, SIDE = "job", ".lock", "flowengine"
#: A znode read leniently: (its JSON object or None if unreadable, stat), None if missing.
Found = tuple[dict[str, Any] | None, ZnodeStat] | None


def iso_time(ms: int) -> str:
    """A znode time (ms since the epoch) as TaskFlow's naive-UTC ISO time."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).replace(tzinfo=None).isoformat()


def _is_job(name: str) -> bool:
    return name.startswith(JOB_PREFIX) and not name.endswith(LOCK_POSTFIX)


class _Children:
    """One watch on ``P`` split into the jobs watch and the locks watch of :class:`ZkEvents`."""

    def __init__(
        self, jobs: Callable[[list[str]], bool], locks: Callable[[list[str]], bool]
    ) -> None:
        self._jobs, self._locks = jobs, locks

    def __call__(self, children: list[str]) -> bool:
        keep_jobs = self._jobs([c for c in children if _is_job(c)])
        keep_locks = self._locks(
            [c[: -len(LOCK_POSTFIX)] for c in children if c.endswith(LOCK_POSTFIX)]
        )
        return keep_jobs and keep_locks


class TaskflowZkEvents(zk_events.ZkEvents):
    """Board events from one watch on TaskFlow's job folder (names mapped to uuids)."""

    def __init__(self, client: Any, path: str, uuid_of: Callable[[str], str | None]) -> None:
        super().__init__(client, path, path, path)
        self._uuid_of = uuid_of
        for watch in self._watches:
            watch._emit = self._named
        self._path = path

    def _named(self, event: BoardEvent) -> None:
        self._queue.put(BoardEvent(event.kind, self._uuid_of(event.uuid or "")))

    def _watched(self) -> list[tuple[str, Callable[[list[str]], bool]]]:
        """One folder, whose listing feeds both watches."""
        return [(self._path, _Children(*self._watches))]


class TaskflowZkReader(ZkReader):
    """The reads of a board store on TaskFlow's znodes (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        path: str,
        owns_client: bool,
        check_compatible: bool = True,
        where: str = "",
    ) -> None:
        super().__init__(client, path, owns_client, check_compatible, where)
        parent, base = posixpath.split(path.rstrip("/"))
        self.trash_path = posixpath.join(parent, ".trash")
        self.entity_path = posixpath.join(parent, ".entities")
        self._side = posixpath.join(parent, f".{SIDE}-{base}")
        self._names: dict[str, str] = {}  # uuid -> job znode name
        self._unreadable: set[str] = set()

    def _uuid_of(self, name: str) -> str | None:
        return next((u for u, n in list(self._names.items()) if n == name), None)

    def _job(self, name: str) -> str:
        return posixpath.join(self.path, name)

    def _place(self, where: str, name: str) -> str:
        """The znode of ``name`` in the trash, dead letter or done folder (the folder if "")."""
        folder = (
            self.trash_path
            if where == records.IN_TRASH
            else posixpath.join(self._side, "dead" if where == records.IN_DEAD_LETTER else "done")
        )
        return posixpath.join(folder, name) if name else folder

    # Reading.

    def _found(self, paths: Sequence[str]) -> list[Found]:
        """Each znode's JSON object (None if unreadable, warned once) and stat."""
        pending = [self._client.get_async(p) for p in paths]
        out: list[Found] = []
        for path, result in zip(paths, pending):
            try:
                data, stat = self._wait(result)
            except exc.JobFailure as e:
                if isinstance(e.cause, k_exc.NoNodeError):
                    out.append(None)
                    continue
                raise
            try:
                value = self._decode(path, data)
            except exc.JobFailure as e:
                if path not in self._unreadable:
                    self._unreadable.add(path)
                    LOG.warning("Skipping %s: %s. It is left in place and not read again", path, e)
                value = None
            out.append((value, stat))
        return out

    def _job_record(self, name: str, job: Found, lock: Found, where: str) -> JobRecord | None:
        data = job[0] if job is not None else None
        if job is None or data is None or "uuid" not in data or "name" not in data:
            return None
        stat = job[1]
        side = data.get(SIDE) or {}
        posting = {k: v for k, v in data.items() if k != SIDE}
        posting["sequence"] = (
            int(name[len(JOB_PREFIX) :]) if name[len(JOB_PREFIX) :].isdigit() else stat.czxid
        )
        if not posting.get("created_on"):
            posting["created_on"] = iso_time(stat.ctime)  # TaskFlow's: the znode's ctime
        self._names[str(data["uuid"])] = name
        holder = (lock[0] or {}).get("owner") if lock is not None else None
        nb = float(side.get("not_before") or 0)
        return JobRecord(
            posting,
            attempts=int(side.get("attempts") or 0),
            token=stat.mzxid if side.get("owner") else int(side.get("token") or 0),
            owner=holder or side.get("owner"),
            leased=lock is not None and where == records.LISTED,
            not_before=self._host_s(nb) if nb > self._now_ms() else None,
            where=where,
        )

    def _scan(self, folder: str, where: str) -> list[JobRecord]:
        with self._zk():
            names = sorted(n for n in self._client.get_children(folder) if _is_job(n))
        reads = self._found([posixpath.join(folder, n) for n in names])
        locks = (
            self._found([self._job(n + LOCK_POSTFIX) for n in names])
            if where == records.LISTED
            else [None] * len(names)
        )
        out = [self._job_record(n, j, lk, where) for n, j, lk in zip(names, reads, locks)]
        return [r for r in out if r is not None]

    def listing(self) -> list[JobRecord]:
        """Every readable job in TaskFlow's folder."""
        listed = self._scan(self.path, records.LISTED)
        # Forget the names of jobs that left (get() scans again for a parked one).
        keep = {r.uuid for r in listed}
        for uuid in list(self._names):  # a copy: other threads add names meanwhile
            if uuid not in keep:
                self._names.pop(uuid, None)
        return listed

    def count(self) -> int:
        """How many readable jobs are listed (as TaskFlow's board counts them)."""
        return len(self.listing())

    def parked(self, where: str) -> list[JobRecord]:
        """TaskFlow's trash, or flowengine's dead letter."""
        return self._scan(
            self.trash_path if where == records.IN_TRASH else self._place(where, ""), where
        )

    def _locate(self, uuid: str) -> tuple[str, str, Found, Found] | None:
        """(where, name, job, lock) of a job, scanning again once if its name is unknown."""
        for attempt in range(2):
            name = self._names.get(uuid)
            if name is not None:
                job, lock, trashed, dead = self._found(
                    [
                        self._job(name),
                        self._job(name + LOCK_POSTFIX),
                        self._place(records.IN_TRASH, name),
                        self._place(records.IN_DEAD_LETTER, name),
                    ]
                )
                for where, found in (
                    (records.LISTED, job),
                    (records.IN_TRASH, trashed),
                    (records.IN_DEAD_LETTER, dead),
                ):
                    if found is not None:
                        return where, name, found, lock
            if attempt == 0:
                for where in (records.LISTED, records.IN_TRASH, records.IN_DEAD_LETTER):
                    self.parked(where) if where != records.LISTED else self.listing()
        return None

    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is (a consumed one while its outcome is kept), or None."""
        found = self._locate(uuid)
        if found is not None:
            where, name, job, lock = found
            return self._job_record(name, job, lock, where)
        done = self._found([self._place(records.CONSUMED, uuid)])[0]
        if (
            done is None
            or done[0] is None
            or float(done[0].get("outcome_until") or 0) < self._now_ms()
        ):
            return None
        return JobRecord({**done[0]["posting"], "sequence": 0}, where=records.CONSUMED)

    def finished(self, limit: int) -> list[Finished]:
        """Jobs flowengine consumed whose outcome is kept, newest first.

        They are in flowengine's ``done`` folder; a job TaskFlow's own
        conductors consumed is deleted by them with no record, so it is
        never among them.
        """
        folder = self._place(records.CONSUMED, "")
        with self._zk():
            names = sorted(self._client.get_children(folder))
        now = self._now_ms()
        found = []
        for read in self._found([posixpath.join(folder, n) for n in names]):
            data = read[0] if read is not None else None
            if (
                not data
                or not data.get("outcome")
                or not isinstance(data.get("posting"), dict)
                or float(data.get("outcome_until") or 0) < now
            ):
                continue  # gone, unreadable (warned once) or expired
            done = Outcome.from_dict(data["outcome"])
            found.append(
                (
                    JobRecord(
                        {**data["posting"], "sequence": 0},
                        attempts=done.attempts,
                        token=done.token,
                        where=records.CONSUMED,
                    ),
                    done,
                )
            )
        return newest_first(found, limit)

    def outcome(self, uuid: str) -> Outcome | None:
        """The outcome flowengine recorded (TaskFlow records none), unless it expired."""
        done = self._found([self._place(records.CONSUMED, uuid)])[0]
        data = done[0] if done is not None else None
        if data is None:
            found = self._locate(uuid)
            if found is None or found[0] == records.LISTED or found[2] is None:
                return None
            data = (found[2][0] or {}).get(SIDE) or {}
        if not data.get("outcome") or float(data.get("outcome_until") or 0) < self._now_ms():
            return None
        return Outcome.from_dict(data["outcome"])

    def lease_remaining(self, uuid: str) -> float | None:
        """Unknown: a claim here lasts as long as its claimer's session."""
        return None

    # Connection and events.

    def connect(self) -> None:
        """Start the session, check the server, create TaskFlow's folders and ours."""
        with self._zk():
            self._start_client()
            if self._check:
                kazoo_utils.check_compatible(self._client, (3, 4, 0))
            for folder in (
                self.path,
                self.trash_path,
                self._place(records.IN_DEAD_LETTER, ""),
                self._place(records.CONSUMED, ""),
            ):
                self._client.ensure_path(folder)
            self._observe(self._write(posixpath.join(self._side, "clock"), b""))
        self._connected = True

    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver the watch's events to ``callback`` (armed when this returns)."""
        if self._events is None:
            self._events = TaskflowZkEvents(self._client, self.path, self._uuid_of)
            self._events.add(callback)
            with self._zk():
                self._events.start()
        else:
            self._events.add(callback)
