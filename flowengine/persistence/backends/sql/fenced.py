"""The SQL backend's fenced connection: the fence row is checked in each write's transaction.

See :mod:`flowengine.persistence.fencing` for why. PostgreSQL locks the
fence row (``SELECT ... FOR UPDATE``) so an ``advance`` by a newer claimer
waits for, or is waited for by, the write; SQLite's write transactions are
already exclusive (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

from typing import Any

from flowengine.utils import optional

try:
    import sqlalchemy as sa
except ImportError as e:  # the 'sql' extra is not installed
    raise optional.missing_extra("sql", e) from e

from flowengine.persistence.backends import impl_sqlalchemy
from flowengine.persistence.backends.sql import tables
from flowengine.persistence.fencing import Fence

__all__ = ["FencedSQLAlchemyConnection"]


class FencedSQLAlchemyConnection(impl_sqlalchemy.SQLAlchemyConnection):
    """A SQL connection whose every write first checks ``fence`` (FencedOut if superseded)."""

    def __init__(self, backend: impl_sqlalchemy.SQLAlchemyBackend, fence: Fence) -> None:
        super().__init__(backend)
        self._fence = fence

    def _stored(self, conn: sa.engine.Connection) -> int | None:
        query = sa.select(tables.FENCES.c.token).where(tables.FENCES.c.name == self._fence.name)
        if self._dialect == "postgresql":
            query = query.with_for_update()
        return conn.execute(query).scalar()

    def _before_write(self, conn: sa.engine.Connection) -> None:
        self._fence.check(self._stored(conn))

    def advance_fence(self) -> None:
        """Raise the fence row to our token, atomically (FencedOut if it is above)."""
        with self._txn() as conn:
            stored = self._stored(conn)
            self._fence.check(stored)
            values: dict[str, Any] = {"token": self._fence.token}
            if stored is None:
                # Two claimers may insert at once on PostgreSQL (no row to
                # lock yet): the loser's insert fails and its caller retries.
                conn.execute(tables.FENCES.insert().values(name=self._fence.name, **values))
            elif stored < self._fence.token:
                conn.execute(
                    tables.FENCES.update()
                    .where(tables.FENCES.c.name == self._fence.name)
                    .values(**values)
                )
