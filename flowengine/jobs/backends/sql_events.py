"""Board events of the SQL jobboard: PostgreSQL LISTEN/NOTIFY, or local sockets for SQLite.

:class:`SqlEvents` hides which: ``notify_in(conn, event)`` is called inside
the transaction that changed the board (PostgreSQL delivers the NOTIFY when
it commits, never for a rolled-back change), ``after_commit(event)`` right
after it (SQLite: the datagrams of :mod:`.local_events`), and
``subscribe(callback)`` starts the listening thread.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine.jobs.backends import event_thread, local_events
from flowengine.jobs.store import BoardEvent

__all__ = ["SqlEvents"]

#: How long one wait for notifications blocks before looking again whether
#: the thread should stop (closing the connection wakes it sooner).
NOTIFY_BLOCK_S = 5.0


def _channel(namespace: str) -> str:
    # A LISTEN channel is an identifier (at most 63 bytes): keep it plain.
    plain = re.sub(r"[^a-z0-9_]", "_", namespace.lower())[:24]
    digest = hashlib.sha256(namespace.encode()).hexdigest()[:12]
    return f"flowengine_jobs_{plain}_{digest}"


class SqlEvents:
    """Sends and receives one namespace's board events (see the module docstring)."""

    def __init__(self, dialect: str, namespace: str, url: Any, database: str | None) -> None:
        self._dialect = dialect
        self._namespace = namespace
        self._url = url
        self._channel = _channel(namespace)
        self._directory = (
            local_events.directory_for(database, namespace)
            if dialect == "sqlite" and database
            else None
        )
        self._local: list[Callable[[BoardEvent], None]] = []
        self._thread: event_thread.EventThread | None = None

    def notify_in(self, conn: Any, event: BoardEvent) -> None:
        """Queue ``event`` in the changing transaction (PostgreSQL)."""
        if self._dialect == "postgresql":
            import sqlalchemy as sa

            conn.execute(
                sa.text("SELECT pg_notify(:c, :p)"), {"c": self._channel, "p": event.encode()}
            )

    def after_commit(self, event: BoardEvent) -> None:
        """Deliver ``event`` after its transaction committed (SQLite, or in-process)."""
        if self._dialect == "postgresql":
            return
        if self._directory is not None:
            local_events.send(self._directory, event.encode().encode())
        else:  # an in-memory database lives in this process only
            for callback in list(self._local):
                callback(event)

    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver every event of this namespace to ``callback`` until close()."""
        if self._dialect != "postgresql" and self._directory is None:
            self._local.append(callback)
            return
        if self._thread is None:
            if self._dialect == "postgresql":
                self._thread = event_thread.EventThread(
                    self._namespace,
                    self._pg_open,
                    self._pg_receive,
                    lambda c: c.close(),
                    BoardEvent.decode,
                    _pg_errors(),
                )
            else:
                directory: str = self._directory  # type: ignore[assignment]
                self._thread = event_thread.EventThread(
                    self._namespace,
                    lambda: local_events.listen(directory),
                    local_events.receive,
                    local_events.shut,
                    BoardEvent.decode,
                    (OSError,),
                )
            self._thread.add(callback)
            if not self._thread.start():
                raise exc.BoardUnavailable(
                    f"Could not listen for jobboard events of namespace {self._namespace!r}"
                )
        else:
            self._thread.add(callback)

    def close(self, engine: Any = None) -> None:
        """Stop listening (``engine``: a way to wake a LISTEN blocked on PostgreSQL)."""
        if self._thread is not None:
            if self._dialect == "postgresql" and engine is not None:
                self._wake(engine)
            self._thread.stop()
            self._thread = None
        self._local.clear()

    def _wake(self, engine: Any) -> None:
        # The listening connection is busy waiting: a notification ends the
        # wait at once, so close() need not wait out NOTIFY_BLOCK_S.
        import sqlalchemy as sa

        try:
            with engine.begin() as conn:
                conn.execute(sa.text("SELECT pg_notify(:c, 'wake')"), {"c": self._channel})
        except Exception:  # the server is gone: the wait ends by timeout instead
            pass

    def _pg_open(self) -> Any:
        import psycopg

        conninfo = self._url.set(drivername="postgresql").render_as_string(hide_password=False)
        conn = psycopg.connect(conninfo, autocommit=True)
        conn.execute(f'LISTEN "{self._channel}"')
        return conn

    @staticmethod
    def _pg_receive(conn: Any) -> list[str]:
        # stop_after=1: hand each notification on as it arrives.
        return [n.payload for n in conn.notifies(timeout=NOTIFY_BLOCK_S, stop_after=1)]


def _pg_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.OperationalError, psycopg.InterfaceError, OSError)
