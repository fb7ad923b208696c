"""Alembic environment: migrate the connection ``upgrade()`` hands over.

Only online migrations on a given connection are supported: the backend
owns the engine and the transaction (and its locking).
"""

from __future__ import annotations

from alembic import context

from flowengine.persistence.backends.sql import tables


def _run() -> None:
    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=tables.METADATA,
        # SQLite cannot ALTER most things: batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        # Our own revision table name, so we never touch an application's.
        version_table="flowengine_alembic_version",
    )
    with context.begin_transaction():
        context.run_migrations()


_run()
