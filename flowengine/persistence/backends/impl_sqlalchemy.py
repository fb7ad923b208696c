"""SQL backend through SQLAlchemy: ``sqlite:///path`` and ``postgresql://...``.

SQLite is the embedded default (one file, several processes may share it);
PostgreSQL (driver psycopg 3) serves engines on several machines. ``upgrade()``
creates or migrates the schema with alembic; call it once before use (the
``backends.backend(conf)`` context does). Every call runs in one transaction,
so a reader never sees half of a write and a killed process leaves nothing
half-written.

Configuration (TaskFlow's names): ``connection`` (the SQLAlchemy URL),
``echo``, ``idle_timeout`` (seconds before a pooled connection is recycled),
``max_pool_size``, ``max_overflow``, ``pool_timeout``, ``isolation_level``,
``engine_args`` (dict passed to ``sqlalchemy.create_engine``).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from flowengine.utils import optional

try:
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import pool as sa_pool
    from sqlalchemy.dialects import postgresql as sa_postgresql
    from sqlalchemy.dialects import sqlite as sa_sqlite
except ImportError as e:  # the 'sql' extra is not installed
    raise optional.missing_extra("sql", e) from e

from flowengine import exceptions as exc
from flowengine.persistence import base, models
from flowengine.persistence.backends.sql import migration, pg_errors, rows, tables

__all__ = ["Connection", "SQLAlchemyBackend", "SQLAlchemyConnection"]

LOG = logging.getLogger(__name__)

#: How long a SQLite writer waits for another process's transaction before
#: failing. Transactions here are single short statements batches, so a wait
#: this long means a stuck process, not contention.
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: SQLite durability: with WAL, NORMAL survives any process crash (kill -9);
#: only a power loss may drop the last commits, never corrupt the file.
#: FULL would add a disk flush per saved state change.
SQLITE_SYNCHRONOUS = "NORMAL"
#: Recycle pooled server connections after this long (servers drop idle ones).
POOL_RECYCLE_S = 3600
#: Key of the PostgreSQL advisory lock serialising concurrent upgrade() calls
#: ("flowengine" in ASCII, truncated to fit a bigint).
PG_MIGRATION_LOCK_KEY = 0x666C6F77656E67
#: DBAPI driver used for a bare ``postgresql://`` URL (psycopg 3, binary wheels).
PG_DEFAULT_DRIVER = "psycopg"
#: validate(max_retries=N): first wait after a refused connection, doubled
#: after each further failure up to the cap (a database restarting takes seconds).
VALIDATE_FIRST_WAIT_S = 0.5
VALIDATE_MAX_WAIT_S = 8.0
# Errors of the connection itself, worth trying again (a server starting or
# restarting, a pool momentarily exhausted); anything else is final.
_CONNECTION_ERRORS = (sa_exc.OperationalError, sa_exc.DisconnectionError, sa_exc.TimeoutError)
# URLs meaning an in-memory SQLite database (one per engine: keep a single connection).
_SQLITE_IN_MEMORY = ("sqlite://", "sqlite:///", "sqlite:///:memory:")


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN (pysqlite's own deferred
    # BEGIN would let two writers deadlock instead of waiting).
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
        cursor.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Any) -> None:
    # Take the write lock up front: waits (busy_timeout) instead of failing
    # when another process writes, and no read-then-write upgrade deadlock.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


class SQLAlchemyBackend(base.Backend):
    """A backend storing logbooks, flow and atom details in SQL tables.

    ``engine`` may be an existing SQLAlchemy engine (then not disposed on close).
    """

    def __init__(
        self, conf: dict[str, Any] | None = None, engine: sa.engine.Engine | None = None
    ) -> None:
        super().__init__(conf)
        if engine is None and not self._conf.get("connection"):
            raise ValueError(
                "The SQL backend needs a 'connection' URL, e.g."
                " 'sqlite:///flows.db' or 'postgresql://user@host/db'"
            )
        self._engine: sa.engine.Engine | None = engine
        self._owns_engine = engine is None

    def _create_engine(self) -> sa.engine.Engine:
        conf = dict(self._conf)
        url = sa.engine.make_url(conf["connection"])
        if url.drivername == "postgresql":
            # The driver flowengine depends on ('sql' extra), whatever
            # SQLAlchemy's default for a bare 'postgresql://' is.
            url = url.set(drivername=f"postgresql+{PG_DEFAULT_DRIVER}")
        args: dict[str, Any] = {
            "echo": _as_bool(conf.get("echo", False)),
            "pool_recycle": int(conf.get("idle_timeout", POOL_RECYCLE_S)),
        }
        is_sqlite = url.get_backend_name() == "sqlite"
        if is_sqlite:
            if conf["connection"].strip().lower() in _SQLITE_IN_MEMORY:
                # One shared connection, or each checkout sees an empty database.
                args["poolclass"] = sa_pool.StaticPool
                args["connect_args"] = {"check_same_thread": False}
        else:
            # Defaults are fine for the server pool; TaskFlow's option names.
            for key, arg in (
                ("max_pool_size", "pool_size"),
                ("max_overflow", "max_overflow"),
                ("pool_timeout", "pool_timeout"),
            ):
                if key in conf:
                    args[arg] = int(conf[key])
            # Read committed: each statement sees committed data, no dirty reads.
            args["isolation_level"] = conf.get("isolation_level", "READ COMMITTED")
            # A pooled connection is checked before use: after a database
            # restart the first write would otherwise fail on a dead socket.
            args["pool_pre_ping"] = True
        args.update(conf.get("engine_args") or {})
        engine = sa.create_engine(url, **args)
        if is_sqlite:
            sa.event.listen(engine, "connect", _sqlite_on_connect)
            sa.event.listen(engine, "begin", _sqlite_on_begin)
        return engine

    @property
    def engine(self) -> sa.engine.Engine:
        """The SQLAlchemy engine (created on first use)."""
        if self._engine is None:
            try:
                self._engine = self._create_engine()
            except (sa_exc.SQLAlchemyError, ImportError, ValueError) as e:
                raise exc.StorageFailure(
                    f"Cannot create a SQL engine for {self._safe_url()}: {e}", cause=e
                ) from e
        return self._engine

    def _safe_url(self) -> str:
        # The user's password and a client key's sslpassword never show.
        return pg_errors.safe_url(str(self._conf["connection"]))

    def tls_failure(self, error: BaseException) -> exc.StorageFailure | None:
        """A one-line StorageFailure when ``error`` comes from TLS settings that cannot work.

        (A wrong CA or a refused client certificate: retrying will not help.)
        The caller raises it ``from error``.
        """
        problem = pg_errors.tls_problem(error)
        if problem is None:
            return None
        # No cause= (its text would follow, several lines): the caller chains it.
        return exc.StorageFailure(f"PostgreSQL at {self._safe_url()}: {problem}")

    def fenced_connection(self, fence: Any) -> SQLAlchemyConnection:
        """A connection whose writes are refused once ``fence`` is superseded.

        The fence row is checked in each write's own transaction (see
        :mod:`flowengine.persistence.fencing`).
        """
        from flowengine.persistence.backends.sql import fenced

        return fenced.FencedSQLAlchemyConnection(self, fence)

    def get_connection(self) -> SQLAlchemyConnection:
        """Return a connection (cheap: connections come from the engine's pool)."""
        return SQLAlchemyConnection(self)

    def close(self) -> None:
        """Dispose of the engine's pooled connections (if this backend made the engine)."""
        if self._engine is not None and self._owns_engine:
            self._engine.dispose()
            self._engine = None


def _utcnow() -> datetime.datetime:
    """Now as a naive UTC datetime: how TaskFlow stores created_at/updated_at."""
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def _is_missing_schema(error: Exception) -> bool:
    text = str(error).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)


class SQLAlchemyConnection(base.Connection):
    """A connection to a SQLAlchemyBackend: each call is one transaction."""

    def __init__(self, backend: SQLAlchemyBackend) -> None:
        self._backend = backend
        self._engine = backend.engine
        self._dialect = self._engine.dialect.name

    @property
    def backend(self) -> SQLAlchemyBackend:
        """The backend this connection belongs to."""
        return self._backend

    def close(self) -> None:
        """Nothing held between calls (pooled connections go back after each)."""

    @contextlib.contextmanager
    def _txn(self, write: bool = False) -> Iterator[sa.engine.Connection]:
        try:
            with self._engine.begin() as conn:
                if write:
                    self._before_write(conn)
                yield conn
        except exc.FlowEngineError:
            raise
        except sa_exc.SQLAlchemyError as e:
            tls = self._backend.tls_failure(e)
            if tls is not None:
                raise tls from e
            hint = " (schema missing: call upgrade() first)" if _is_missing_schema(e) else ""
            raise exc.StorageFailure(
                f"Storage backend internal error ({self._backend._safe_url()}){hint}: {e}", cause=e
            ) from e

    def _before_write(self, conn: sa.engine.Connection) -> None:
        """Runs first in every write transaction (a fenced connection checks its fence)."""

    # Schema.

    def validate(self, max_retries: int = 0) -> None:
        """Check the database can be connected to, as TaskFlow's ``validate`` does.

        Only the connection is checked, not the schema (a database nobody has
        upgraded yet validates; Octavia's ``octavia-status upgrade check``
        relies on that): see :meth:`check_schema`.  A connection refused or
        dropped is tried again up to ``max_retries`` attempts in all, waiting
        longer each time; StorageFailure once they are spent.
        """
        attempts = max(1, int(max_retries))
        wait_s = VALIDATE_FIRST_WAIT_S
        for attempt in range(1, attempts + 1):
            try:
                with self._engine.connect():
                    return
            except _CONNECTION_ERRORS as e:
                tls = self._backend.tls_failure(e)
                if tls is not None:  # a wrong CA or certificate: no retry helps
                    raise tls from e
                if attempt == attempts:
                    raise exc.StorageFailure(
                        f"Cannot connect to {self._backend._safe_url()} (attempt"
                        f" {attempt} of {attempts}): {e}",
                        cause=e,
                    ) from e
                LOG.warning(
                    "Connecting to %s failed (attempt %d of %d), trying again in %.1f s: %s",
                    self._backend._safe_url(),
                    attempt,
                    attempts,
                    wait_s,
                    e,
                )
                time.sleep(wait_s)
                wait_s = min(wait_s * 2, VALIDATE_MAX_WAIT_S)
            except sa_exc.SQLAlchemyError as e:
                raise exc.StorageFailure(
                    f"Cannot connect to {self._backend._safe_url()}: {e}", cause=e
                ) from e

    def check_schema(self) -> None:
        """StorageFailure unless the schema is at this flowengine's revision.

        flowengine's addition (TaskFlow's ``validate`` checks the connection
        only): says whether ``upgrade()`` is still to be run.
        """
        with self._txn() as conn:
            current = migration.current_revision(conn)
        head = migration.head_revision()
        if current != head:
            raise exc.StorageFailure(
                f"SQL schema of {self._backend._safe_url()} is at"
                f" revision {current!r}, expected {head!r}:"
                " call upgrade()"
            )

    def upgrade(self) -> None:
        """Create or migrate the schema to the newest revision (alembic).

        A database TaskFlow created is adopted and migrated (see
        :mod:`flowengine.persistence.backends.sql.migration`); StorageFailure
        when it is older than TaskFlow 6.5's schema.
        """
        # Several engines may start at once: one migrates, the others wait.
        with _sqlite_migration_lock(self._engine), self._txn() as conn:
            if self._dialect == "postgresql":
                conn.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK_KEY}
                )
            migration.db_sync(conn, where=self._backend._safe_url())

    def clear_all(self) -> None:
        """Delete every logbook, flow detail and atom detail."""
        with self._txn(write=True) as conn:
            for table in (tables.ATOMS, tables.FLOWS, tables.LOGBOOKS, tables.FENCES):
                conn.execute(table.delete())

    # Writing.

    def _upsert(
        self,
        conn: sa.engine.Connection,
        table: sa.Table,
        values: list[dict[str, Any]],
        stamp: bool = False,
    ) -> None:
        """Insert rows or update them; a row's parent is kept when none is given.

        ``stamp``: set ``created_at`` on insert and ``updated_at`` on update,
        as TaskFlow does for flow and atom details.
        """
        if not values:
            return
        keep = ("uuid", "created_at") if stamp else ("uuid",)
        touched: dict[str, Any] = {}
        if stamp:
            now = _utcnow()
            values = [dict(row, created_at=now) for row in values]
            touched["updated_at"] = now
        if self._dialect in ("sqlite", "postgresql"):
            stmt: sa_sqlite.Insert | sa_postgresql.Insert
            if self._dialect == "sqlite":
                stmt = sa_sqlite.insert(table)
            else:
                stmt = sa_postgresql.insert(table)
            updates: dict[str, Any] = {c: stmt.excluded[c] for c in values[0] if c not in keep}
            updates.update(touched)
            if "parent_uuid" in updates:
                updates["parent_uuid"] = sa.func.coalesce(
                    stmt.excluded.parent_uuid, table.c.parent_uuid
                )
            conn.execute(
                stmt.on_conflict_do_update(index_elements=[table.c.uuid], set_=updates), values
            )
            return
        for row in values:  # other dialects: update, else insert
            changes = {
                k: v
                for k, v in row.items()
                if k not in keep and not (k == "parent_uuid" and v is None)
            }
            changes.update(touched)
            done = conn.execute(
                table.update().where(table.c.uuid == row["uuid"]).values(changes)
            ).rowcount
            if not done:
                conn.execute(table.insert().values(row))

    def _update_existing(
        self, conn: sa.engine.Connection, table: sa.Table, row: dict[str, Any], kind: str
    ) -> None:
        changes = {k: v for k, v in row.items() if k not in ("uuid", "parent_uuid")}
        changes["updated_at"] = _utcnow()
        done = conn.execute(
            table.update().where(table.c.uuid == row["uuid"]).values(changes)
        ).rowcount
        if not done:
            raise exc.NotFound(f"No {kind} found with uuid '{row['uuid']}'")

    @staticmethod
    def _atom_rows(fd: models.FlowDetail) -> list[dict[str, Any]]:
        out = []
        for ad in fd:
            row = rows.atom_to_row(ad)
            row["parent_uuid"] = fd.uuid
            out.append(row)
        return out

    def update_atom_details(
        self, atom_detail: models.AtomDetail, ignore_missing: bool = False
    ) -> models.AtomDetail:
        """Save an atom detail (NotFound if unknown, unless ignore_missing)."""
        row = rows.atom_to_row(atom_detail)  # SerializationFailure before any write
        with self._txn(write=True) as conn:
            if ignore_missing:
                row["parent_uuid"] = None
                self._upsert(conn, tables.ATOMS, [row], stamp=True)
            else:
                self._update_existing(conn, tables.ATOMS, row, "AtomDetail")
        return atom_detail

    def update_flow_details(
        self, flow_detail: models.FlowDetail, ignore_missing: bool = False
    ) -> models.FlowDetail:
        """Save a flow detail and the atom details it contains."""
        flow_row = rows.flow_to_row(flow_detail)
        atom_rows = self._atom_rows(flow_detail)
        with self._txn(write=True) as conn:
            if ignore_missing:
                flow_row["parent_uuid"] = None
                self._upsert(conn, tables.FLOWS, [flow_row], stamp=True)
            else:
                self._update_existing(conn, tables.FLOWS, flow_row, "FlowDetail")
            self._upsert(conn, tables.ATOMS, atom_rows, stamp=True)
        return flow_detail

    def save_logbook(self, book: models.LogBook) -> models.LogBook:
        """Create or update a logbook with the flow (and atom) details it contains."""
        book_row = rows.book_to_row(book)
        flow_rows, atom_rows = [], []
        for fd in book:
            row = rows.flow_to_row(fd)
            row["parent_uuid"] = book.uuid
            flow_rows.append(row)
            atom_rows.extend(self._atom_rows(fd))
        with self._txn(write=True) as conn:
            self._upsert(conn, tables.LOGBOOKS, [book_row])
            self._upsert(conn, tables.FLOWS, flow_rows, stamp=True)
            self._upsert(conn, tables.ATOMS, atom_rows, stamp=True)
        return book

    def destroy_logbook(self, book_uuid: str) -> None:
        """Delete a logbook and everything it contains (NotFound if unknown)."""
        flows = sa.select(tables.FLOWS.c.uuid).where(tables.FLOWS.c.parent_uuid == book_uuid)
        with self._txn(write=True) as conn:
            conn.execute(tables.ATOMS.delete().where(tables.ATOMS.c.parent_uuid.in_(flows)))
            conn.execute(tables.FLOWS.delete().where(tables.FLOWS.c.parent_uuid == book_uuid))
            done = conn.execute(
                tables.LOGBOOKS.delete().where(tables.LOGBOOKS.c.uuid == book_uuid)
            ).rowcount
            if not done:
                raise exc.NotFound(f"No logbook found with uuid '{book_uuid}'")

    def destroy_flow_details(self, fd_uuid: str) -> None:
        """Delete a flow detail and its atom details (NotFound if unknown)."""
        with self._txn() as conn:
            conn.execute(tables.ATOMS.delete().where(tables.ATOMS.c.parent_uuid == fd_uuid))
            done = conn.execute(
                tables.FLOWS.delete().where(tables.FLOWS.c.uuid == fd_uuid)
            ).rowcount
            if not done:
                raise exc.NotFound(f"No flow detail found with uuid '{fd_uuid}'")

    # Reading.

    @staticmethod
    def _one(conn: sa.engine.Connection, table: sa.Table, uuid: str, kind: str) -> Any:
        row = conn.execute(sa.select(table).where(table.c.uuid == uuid)).first()
        if row is None:
            raise exc.NotFound(f"No {kind} found with uuid '{uuid}'")
        return row

    @staticmethod
    def _flows_with_atoms(
        conn: sa.engine.Connection, flow_rows: Iterable[Any], atoms_where: Any, lazy: bool
    ) -> list[models.FlowDetail]:
        flows = [rows.flow_from_row(r) for r in flow_rows]
        if lazy or not flows:
            return flows
        by_uuid = {fd.uuid: fd for fd in flows}
        for r in conn.execute(
            sa.select(tables.ATOMS).where(atoms_where).order_by(tables.ATOMS.c.uuid)
        ):
            fd = by_uuid.get(r.parent_uuid)
            if fd is not None:
                fd.add(rows.atom_from_row(r))
        return flows

    def _books(self, conn: sa.engine.Connection, where: Any, lazy: bool) -> list[models.LogBook]:
        F, A = tables.FLOWS, tables.ATOMS
        books = [
            rows.book_from_row(r)
            for r in conn.execute(
                sa.select(tables.LOGBOOKS).where(where).order_by(tables.LOGBOOKS.c.uuid)
            )
        ]
        if lazy or not books:
            return books
        by_uuid = {b.uuid: b for b in books}
        book_ids = list(by_uuid)
        flow_rows = conn.execute(
            sa.select(F).where(F.c.parent_uuid.in_(book_ids)).order_by(F.c.uuid)
        ).all()
        flow_ids = sa.select(F.c.uuid).where(F.c.parent_uuid.in_(book_ids))
        flows = self._flows_with_atoms(conn, flow_rows, A.c.parent_uuid.in_(flow_ids), False)
        for row, fd in zip(flow_rows, flows):
            by_uuid[row.parent_uuid].add(fd)
        return books

    def get_logbook(self, book_uuid: str, lazy: bool = False) -> models.LogBook:
        """Load a logbook (with its flow details unless lazy); NotFound if unknown."""
        with self._txn() as conn:
            books = self._books(conn, tables.LOGBOOKS.c.uuid == book_uuid, lazy)
        if not books:
            raise exc.NotFound(f"No logbook found with uuid '{book_uuid}'")
        return books[0]

    def get_logbooks(self, lazy: bool = False) -> Iterator[models.LogBook]:
        """Iterate over every stored logbook (read in one transaction)."""
        with self._txn() as conn:
            books = self._books(conn, sa.true(), lazy)
        return iter(books)

    def get_flows_for_book(self, book_uuid: str, lazy: bool = False) -> Iterator[models.FlowDetail]:
        """Iterate over the flow details of a logbook (NotFound if unknown)."""
        F, A = tables.FLOWS, tables.ATOMS
        with self._txn() as conn:
            self._one(conn, tables.LOGBOOKS, book_uuid, "logbook")
            flow_rows = conn.execute(
                sa.select(F).where(F.c.parent_uuid == book_uuid).order_by(F.c.uuid)
            ).all()
            flow_ids = sa.select(F.c.uuid).where(F.c.parent_uuid == book_uuid)
            flows = self._flows_with_atoms(conn, flow_rows, A.c.parent_uuid.in_(flow_ids), lazy)
        return iter(flows)

    def get_flow_details(self, fd_uuid: str, lazy: bool = False) -> models.FlowDetail:
        """Load a flow detail (with its atom details unless lazy); NotFound if unknown."""
        with self._txn() as conn:
            row = self._one(conn, tables.FLOWS, fd_uuid, "flow detail")
            return self._flows_with_atoms(conn, [row], tables.ATOMS.c.parent_uuid == fd_uuid, lazy)[
                0
            ]

    def get_atom_details(self, ad_uuid: str) -> models.AtomDetail:
        """Load an atom detail; NotFound if unknown."""
        with self._txn() as conn:
            return rows.atom_from_row(self._one(conn, tables.ATOMS, ad_uuid, "atom detail"))

    def get_atoms_for_flow(self, fd_uuid: str) -> Iterator[models.AtomDetail]:
        """Iterate over the atom details of a flow detail (NotFound if unknown)."""
        return iter(self.get_flow_details(fd_uuid, lazy=False))


#: TaskFlow's name for this backend's connection class.
Connection = SQLAlchemyConnection


@contextlib.contextmanager
def _sqlite_migration_lock(engine: sa.engine.Engine) -> Iterator[None]:
    """Serialise schema migrations of one SQLite file across processes.

    SQLite cannot wait its way out of two migrations at once: each reads the
    schema, then both try to write, and the second fails at once with
    "database is locked" (its busy timeout does not apply to that upgrade of
    a read lock). PostgreSQL uses an advisory lock instead; an in-memory
    database has a single connection and needs nothing.
    """
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        yield
        return
    with open(f"{database}.migration-lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
