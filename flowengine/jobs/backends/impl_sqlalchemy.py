"""The SQL jobboard: PostgreSQL for many hosts, SQLite for one (TaskFlow has no SQL board).

Users already run this database for persistence, so the board can live in
the same one. Jobs are rows of ``flowengine_jobs`` (created by the same
alembic migrations as the persistence tables); each operation is one
transaction. A claim locks the job's row with ``FOR UPDATE SKIP LOCKED``
on PostgreSQL (a row another conductor is claiming right now is skipped,
not waited for) and sets the lease column from the database's clock; the
token comes from a per-namespace counter row updated in the same
transaction. Wake-ups: ``NOTIFY`` in the changing transaction and a
``LISTEN`` connection per board on PostgreSQL; local datagram sockets on
SQLite (:mod:`.local_events`). SQLite serialises writers (``BEGIN
IMMEDIATE``), so its board suits the processes of one host.

Conf: ``{'board': 'postgresql://user@host/db?namespace=x'}`` (or
``sqlite:///path.db``), or ``{'board': 'postgresql', 'connection': URL}``;
the policy keys of every board; any other URL query option goes to the
database driver. Needs the ``sql`` extra.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib import parse

from flowengine.utils import optional

try:
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert
except ImportError as e:  # the 'sql' extra is not installed
    raise optional.missing_extra("sql", e) from e

from flowengine import exceptions as exc
from flowengine.jobs import board, policy, records
from flowengine.jobs import job as job_mod
from flowengine.jobs.backends import sql_events
from flowengine.jobs.records import Claim, JobRecord, Outcome
from flowengine.jobs.store import (
    Action,
    BoardEvent,
    BoardStore,
    EventKind,
    Finished,
    held,
    newest_first,
)
from flowengine.persistence.backends import impl_sqlalchemy
from flowengine.persistence.backends.sql import pg_errors, tables

__all__ = ["SQLJob", "SQLJobBoard", "SQLStore"]

#: Namespace used when the conf names none.
DEFAULT_NAMESPACE = "flowengine"
#: Query options that configure the board, not the database driver.
BOARD_OPTIONS = frozenset(
    {
        "board",
        "namespace",
        "mask_details",
        "lease_s",
        "max_attempts",
        "backoff_s",
        "backoff_max_s",
        "outcome_ttl_s",
    }
)
_J, _C = tables.JOBS, tables.JOB_COUNTERS
#: INSERT with ON CONFLICT (both dialects spell it the same way).
_DIALECT_INSERT: dict[str, Callable[[sa.Table], Any]] = {
    "postgresql": pg_insert,
    "sqlite": sqlite_insert,
}
_NOW = {
    "postgresql": "SELECT extract(epoch from clock_timestamp())",
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
}


def connection_url(conf: dict[str, Any]) -> str:
    """The database URL of a board conf, without the board's own query options."""
    url = conf.get("connection") or conf.get("board")
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(
            "The SQL jobboard needs a database URL: {'board':"
            " 'postgresql://user@host/db'} or 'sqlite:///jobs.db'"
        )
    # Not urlsplit().geturl(): it would turn sqlite:////abs/path into sqlite://abs/path.
    base, _, query = url.partition("?")
    kept = [(k, v) for k, v in parse.parse_qsl(query) if k not in BOARD_OPTIONS]
    return f"{base}?{parse.urlencode(kept)}" if kept else base


class SQLStore(BoardStore):
    """A :class:`BoardStore` on a SQL database (see the module docstring)."""

    def __init__(self, url: str, namespace: str, lease_s: float) -> None:
        self._url = url
        # For messages: the password and sslpassword masked.
        self._safe = pg_errors.safe_url(url)
        self._ns = namespace
        engine_args: dict[str, Any] = {"pool_pre_ping": True}
        if url.startswith("postgresql"):
            # A claimer paused inside a transaction (SIGSTOP) would hold its row
            # locks, and so block every other claimer, until it woke up: the
            # server ends such a session after one lease instead.
            engine_args["connect_args"] = {
                "options": f"-c idle_in_transaction_session_timeout={int(lease_s * 1000)}"
            }
        # The persistence backend's engine: same drivers, pool and SQLite pragmas.
        self._sql = impl_sqlalchemy.SQLAlchemyBackend(
            {"connection": url, "engine_args": engine_args}
        )
        self._events: sql_events.SqlEvents | None = None

    @property
    def connected(self) -> bool:
        """Whether connect() succeeded and close() was not called since."""
        return self._events is not None

    def connect(self) -> None:
        """Create or migrate the tables, make this namespace's counters."""
        try:
            self._migrate()
        except exc.StorageFailure as e:
            problem = pg_errors.tls_problem(e)
            if problem is not None:  # a wrong CA or certificate: no retry helps
                # One line: no cause= (its text would follow); chained all the same.
                raise exc.JobFailure(f"Jobboard database {self._safe}: {problem}") from e
            unreachable = isinstance(e.cause, (sa_exc.OperationalError, sa_exc.InterfaceError))
            error = exc.BoardUnavailable if unreachable else exc.JobFailure
            raise error(f"Jobboard database {self._safe}: {e}", cause=e) from e
        engine = self._sql.engine
        with self._txn() as conn:
            # Boards connecting at once to a new namespace each try to make its
            # counters: the first one does, the others leave its row alone.
            insert = _DIALECT_INSERT[conn.dialect.name](_C)
            conn.execute(
                insert.values(namespace=self._ns, sequence=0, token=0).on_conflict_do_nothing(
                    index_elements=[_C.c.namespace]
                )
            )
            conn.execute(
                _J.delete().where(
                    _J.c.namespace == self._ns,
                    _J.c.location == records.CONSUMED,
                    _J.c.outcome_until < self._now(conn),
                )
            )
        self._events = sql_events.SqlEvents(
            engine.dialect.name, self._ns, engine.url, engine.url.database
        )

    def _migrate(self) -> None:
        """Create or migrate the tables, on PostgreSQL without the idle bound.

        A migration reflects the schema in one transaction of many
        statements; on a loaded machine the gaps between them outlast a short
        lease (seen with 1 s), and the server ended the session mid-way. The
        bound is there for claimers paused with row locks held: a migration
        runs once, so it gets a connection of its own without that bound.
        """
        if not self._url.startswith("postgresql"):
            with contextlib.closing(self._sql.get_connection()) as conn:
                conn.upgrade()
            return
        migrator = impl_sqlalchemy.SQLAlchemyBackend(
            {"connection": self._url, "engine_args": {"pool_pre_ping": True}}
        )
        try:
            with contextlib.closing(migrator.get_connection()) as conn:
                conn.upgrade()
        finally:
            migrator.close()

    def close(self) -> None:
        """Stop listening and dispose of the connection pool."""
        if self._events is not None:
            self._events.close(self._sql.engine)
            self._events = None
        self._sql.close()

    @contextlib.contextmanager
    def _txn(self) -> Iterator[sa.engine.Connection]:
        try:
            with self._sql.engine.begin() as conn:
                yield conn
        except exc.FlowEngineError:
            raise
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as e:
            raise exc.BoardUnavailable(
                f"Jobboard database {self._safe} is unreachable: {e}", cause=e
            ) from e
        except sa_exc.SQLAlchemyError as e:
            raise exc.JobFailure(f"Jobboard database {self._safe} failed: {e}", cause=e) from e

    def _now(self, conn: sa.engine.Connection) -> float:
        return float(conn.execute(sa.text(_NOW[conn.dialect.name])).scalar_one())

    def _emit(self, conn: sa.engine.Connection, event: BoardEvent) -> BoardEvent:
        if self._events is None:
            raise exc.JobFailure("The SQL jobboard is not connected (call connect())")
        self._events.notify_in(conn, event)
        return event

    def _after(self, event: BoardEvent | None) -> None:
        if event is not None and self._events is not None:
            self._events.after_commit(event)

    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver this namespace's events to ``callback`` until close()."""
        if self._events is None:
            raise exc.JobFailure("The SQL jobboard is not connected (call connect())")
        self._events.subscribe(callback)

    # Rows.

    def _where(self, uuid: str) -> Any:
        return sa.and_(_J.c.uuid == uuid, _J.c.namespace == self._ns)

    def _row(
        self, conn: sa.engine.Connection, uuid: str, lock: bool = False, skip_locked: bool = False
    ) -> Any:
        query = sa.select(_J).where(self._where(uuid))
        if lock and conn.dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=skip_locked)
        return conn.execute(query).first()

    def _next(self, conn: sa.engine.Connection, column: str) -> int:
        conn.execute(
            _C.update().where(_C.c.namespace == self._ns).values({column: _C.c[column] + 1})
        )
        return int(
            conn.execute(sa.select(_C.c[column]).where(_C.c.namespace == self._ns)).scalar_one()
        )

    @staticmethod
    def _record(row: Any, now: float) -> JobRecord:
        posting = records.decode_posting_fields(row.posting, row.uuid, row.sequence)
        leased = row.owner is not None and (row.lease_until or 0) > now
        # Times are the database's clock; hand them out on this host's clock.
        skew = time.time() - now
        nb = row.not_before
        return JobRecord(
            posting,
            attempts=row.attempts,
            token=row.token,
            owner=row.owner,
            leased=leased,
            lease_expires_at=row.lease_until + skew if leased else None,
            not_before=nb + skew if nb and nb > now else None,
            where=row.location,
        )

    # Reading.

    def listing(self) -> list[JobRecord]:
        """Every listed job."""
        return self.parked(records.LISTED)

    def parked(self, where: str) -> list[JobRecord]:
        """The jobs at ``where`` (listed, trash, dead letter)."""
        with self._txn() as conn:
            now = self._now(conn)
            rows = conn.execute(
                sa.select(_J).where(_J.c.namespace == self._ns, _J.c.location == where)
            ).all()
        return [self._record(r, now) for r in rows]

    def finished(self, limit: int) -> list[Finished]:
        """Consumed jobs whose outcome is kept, newest first (one query, database clock)."""
        with self._txn() as conn:
            now = self._now(conn)
            rows = conn.execute(
                sa.select(_J).where(
                    _J.c.namespace == self._ns,
                    _J.c.location == records.CONSUMED,
                    _J.c.outcome.is_not(None),
                    _J.c.outcome_until >= now,
                )
            ).all()
        return newest_first(
            [(self._record(r, now), Outcome.from_dict(json.loads(r.outcome))) for r in rows], limit
        )

    def count(self) -> int:
        """How many jobs are listed."""
        with self._txn() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(_J)
                    .where(_J.c.namespace == self._ns, _J.c.location == records.LISTED)
                ).scalar_one()
            )

    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is (a consumed one while its outcome is kept), or None."""
        with self._txn() as conn:
            now, row = self._now(conn), self._row(conn, uuid)
        if row is None or (row.location == records.CONSUMED and (row.outcome_until or 0) < now):
            return None
        return self._record(row, now)

    def outcome(self, uuid: str) -> Outcome | None:
        """The recorded outcome, unless it expired."""
        with self._txn() as conn:
            now, row = self._now(conn), self._row(conn, uuid)
        if row is None or row.outcome is None or (row.outcome_until or 0) < now:
            return None
        return Outcome.from_dict(json.loads(row.outcome))

    def lease_remaining(self, uuid: str) -> float | None:
        """Seconds left on the current lease, or None."""
        with self._txn() as conn:
            now, row = self._now(conn), self._row(conn, uuid)
        if row is None or row.owner is None or (row.lease_until or 0) <= now:
            return None
        return float(row.lease_until) - now

    # Changing.

    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """Insert the job with the namespace's next sequence; NOTIFY posted."""
        body = dict(posting)
        body.pop("sequence", None)
        with self._txn() as conn:
            seq = self._next(conn, "sequence")
            conn.execute(
                _J.insert().values(
                    uuid=posting["uuid"],
                    namespace=self._ns,
                    posting=records.encode_posting(body),
                    sequence=seq,
                    location=records.LISTED,
                    attempts=0,
                    token=0,
                )
            )
            event = self._emit(conn, BoardEvent(EventKind.POSTED, posting["uuid"]))
        self._after(event)
        return JobRecord({**posting, "sequence": seq})

    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """Lease the job to ``who`` under the namespace's next token (see BoardStore)."""
        with self._txn() as conn:
            row = self._row(conn, uuid, lock=True, skip_locked=True)
            if row is None:
                if conn.execute(sa.select(_J.c.uuid).where(self._where(uuid))).first():
                    raise held(uuid, None)  # row locked: another claim is under way
                raise exc.NotFound(f"Job {uuid} not found to be claimed")
            now = self._now(conn)
            if row.location != records.LISTED:
                raise exc.NotFound(f"Job {uuid} not found to be claimed")
            if row.owner is not None and (row.lease_until or 0) > now:
                raise held(uuid, row.owner)
            if row.not_before is not None and row.not_before > now:
                raise exc.UnclaimableJob(
                    f"Job {uuid} is backing off for another {row.not_before - now:.1f} s"
                )
            if row.attempts >= max_attempts:
                done = Outcome(
                    uuid, records.DEAD, None, row.token, row.attempts, now, "too many attempts"
                )
                conn.execute(
                    _J.update()
                    .where(self._where(uuid))
                    .values(
                        location=records.IN_DEAD_LETTER,
                        owner=None,
                        lease_until=None,
                        outcome=json.dumps(done.to_dict()),
                        outcome_until=now + outcome_ttl_s,
                    )
                )
                event = self._emit(conn, BoardEvent(EventKind.DONE, uuid, records.DEAD))
                claim = None
            else:
                token = self._next(conn, "token")
                conn.execute(
                    _J.update()
                    .where(self._where(uuid))
                    .values(
                        owner=who,
                        token=token,
                        attempts=row.attempts + 1,
                        lease_until=now + lease_s,
                        not_before=None,
                    )
                )
                claim, event = Claim(uuid, who, token, row.attempts + 1), None
        if claim is None:
            self._after(event)
            raise exc.UnclaimableJob(
                f"Job {uuid} was claimed {row.attempts} times without"
                f" finishing: moved to the dead letter"
            )
        return claim

    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Extend every lease whose token still holds its job; return the lost uuids."""
        lost = set()
        with self._txn() as conn:
            now = self._now(conn)
            for uuid, token in held:
                done = conn.execute(
                    _J.update()
                    .where(
                        self._where(uuid),
                        _J.c.token == token,
                        _J.c.owner.isnot(None),
                        _J.c.location == records.LISTED,
                    )
                    .values(lease_until=now + lease_s)
                )
                if not done.rowcount:
                    lost.add(uuid)
        return lost

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
        """Consume / trash / abandon / fail in one transaction, fenced by ``token``."""
        done: Outcome | None = None
        with self._txn() as conn:
            row = self._row(conn, uuid, lock=True)
            if row is None or row.location != records.LISTED:
                raise exc.NotFound(f"Job {uuid} not found to {action.value}")
            if row.owner is None:
                raise exc.NotFound(f"Can not {action.value} job {uuid}: nobody claimed it")
            if row.token != token:
                raise exc.ClaimLost(
                    f"Can not {action.value} job {uuid}: claim {token} was"
                    f" superseded by claim {row.token} of {row.owner}"
                )
            if row.owner != who:
                raise exc.JobFailure(
                    f"Can not {action.value} job {uuid} which is not owned"
                    f" by {who} (it is owned by {row.owner})"
                )
            now = self._now(conn)
            values: dict[str, Any] = {"owner": None, "lease_until": None}
            if action is Action.ABANDON:
                values["attempts"] = max(0, row.attempts - 1)
            elif action is Action.FAIL and row.attempts < max_attempts:
                values["not_before"] = now + backoff_s if backoff_s > 0 else None
            else:
                kind = {
                    Action.CONSUME: outcome or records.SUCCEEDED,
                    Action.TRASH: records.TRASHED,
                }.get(action, records.DEAD)
                done = Outcome(uuid, kind, who, token, row.attempts, now, reason)
                values.update(
                    location={Action.CONSUME: records.CONSUMED, Action.TRASH: records.IN_TRASH}.get(
                        action, records.IN_DEAD_LETTER
                    ),
                    outcome=json.dumps(done.to_dict()),
                    outcome_until=now + outcome_ttl_s,
                )
            conn.execute(_J.update().where(self._where(uuid)).values(values))
            event = self._emit(
                conn,
                BoardEvent(EventKind.RELEASED, uuid)
                if done is None
                else BoardEvent(EventKind.DONE, uuid, done.outcome),
            )
        self._after(event)
        return done

    def requeue(self, uuid: str, max_attempts: int) -> JobRecord:
        """Back on the board from the trash or dead letter, attempts reset."""
        with self._txn() as conn:
            row = self._row(conn, uuid, lock=True)
            if row is None or row.location not in (records.IN_TRASH, records.IN_DEAD_LETTER):
                raise exc.NotFound(f"Job {uuid} is neither trashed nor dead-lettered")
            conn.execute(
                _J.update()
                .where(self._where(uuid))
                .values(
                    location=records.LISTED,
                    attempts=0,
                    owner=None,
                    lease_until=None,
                    not_before=None,
                    outcome=None,
                    outcome_until=None,
                )
            )
            event = self._emit(conn, BoardEvent(EventKind.POSTED, uuid))
        self._after(event)
        found = self.get(uuid)
        if found is None:
            raise exc.NotFound(f"Job {uuid} vanished right after being requeued")
        return found

    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """Record the entity until ``ttl_s`` from now."""
        E = tables.JOB_ENTITIES
        with self._txn() as conn:
            now = self._now(conn)
            conn.execute(E.delete().where(E.c.namespace == self._ns, E.c.name == entity["name"]))
            conn.execute(
                E.insert().values(
                    namespace=self._ns,
                    name=entity["name"],
                    entity=json.dumps(entity),
                    expires_at=now + ttl_s,
                )
            )


class SQLJob(job_mod.BoardJob):
    """A job on a :class:`SQLJobBoard`."""


class SQLJobBoard(board.LeasedJobBoard):
    """A jobboard in a SQL database (PostgreSQL or SQLite; see the module docstring)."""

    JOB_CLASS = SQLJob

    def __init__(self, name: str, conf: dict[str, Any], persistence: Any = None) -> None:
        lease_s = policy.BoardPolicy.from_conf(conf).lease_s
        store = SQLStore(
            connection_url(conf), str(conf.get("namespace") or DEFAULT_NAMESPACE), lease_s
        )
        super().__init__(name, conf, store, persistence=persistence)
