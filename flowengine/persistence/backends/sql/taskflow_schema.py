"""Recognise a database TaskFlow's SQL backend created, so ``upgrade()`` can adopt it.

TaskFlow keeps its alembic revision in ``alembic_version`` on PostgreSQL and
MySQL; on SQLite its ``upgrade()`` creates the tables directly and records
no revision. A database is TaskFlow's when its record tables exist but
flowengine's revision table does not. It can be adopted when it is at
TaskFlow 6.5's head revision (or a revision newer than 6.5 knows) and its
tables have every column of that layout; an older TaskFlow schema is refused
with the command that brings it forward.
"""

from __future__ import annotations

import logging

from flowengine.utils import optional

try:
    import sqlalchemy as sa
except ImportError as e:  # the 'sql' extra is not installed
    raise optional.missing_extra("sql", e) from e

from flowengine import exceptions as exc

__all__ = ["TASKFLOW_HEAD", "TASKFLOW_VERSION_TABLE", "check_adoptable", "taskflow_revision"]

LOG = logging.getLogger(__name__)

#: TaskFlow 6.5's newest alembic revision.
TASKFLOW_HEAD = "00af93df9d77"
#: Where TaskFlow's alembic keeps its revision (alembic's default table).
TASKFLOW_VERSION_TABLE = "alembic_version"
#: TaskFlow's revisions before its head, oldest first: their schemas lack
#: columns or types of the head's on some database, so they are refused.
TASKFLOW_OLDER = (
    "1cea328f0f65",
    "1c783c0c2875",
    "84d6e888850",
    "14b227d79a87",
    "589dccdf2b6e",
    "3162c0f3f8e4",
    "2ad4984f2864",
    "0bc3e1a3c135",
    "6df9422fcb43",
    "40fc8c914bd2",
)
#: The columns of TaskFlow 6.5's record tables.
TASKFLOW_COLUMNS = {
    "logbooks": ("created_at", "updated_at", "meta", "name", "uuid"),
    "flowdetails": ("created_at", "updated_at", "parent_uuid", "meta", "name", "state", "uuid"),
    "atomdetails": (
        "created_at",
        "updated_at",
        "meta",
        "parent_uuid",
        "name",
        "version",
        "state",
        "uuid",
        "failure",
        "results",
        "revert_results",
        "revert_failure",
        "atom_type",
        "intention",
    ),
}


def taskflow_revision(connection: sa.engine.Connection) -> str | None:
    """TaskFlow's alembic revision in this database (None when it records none)."""
    if not sa.inspect(connection).has_table(TASKFLOW_VERSION_TABLE):
        return None
    return connection.execute(sa.text(f"SELECT version_num FROM {TASKFLOW_VERSION_TABLE}")).scalar()


def check_adoptable(connection: sa.engine.Connection, where: str) -> bool:
    """Whether ``connection`` holds a TaskFlow schema to adopt (False: no schema at all).

    Raises StorageFailure, naming ``where`` and the cause, for a TaskFlow
    schema older than 6.5's head or tables that are not TaskFlow's.
    """
    inspector = sa.inspect(connection)
    if not inspector.has_table("logbooks"):
        return False
    revision = taskflow_revision(connection)
    if revision in TASKFLOW_OLDER:
        raise exc.StorageFailure(
            f"The TaskFlow schema of {where} is at TaskFlow revision {revision!r}, older"
            f" than TaskFlow 6.5's {TASKFLOW_HEAD!r}: run TaskFlow 6.5's upgrade() on it"
            " first (taskflow.persistence.backends.fetch(conf).get_connection().upgrade()),"
            " then flowengine's"
        )
    missing: list[str] = []
    for table, wanted in TASKFLOW_COLUMNS.items():
        present = (
            {c["name"] for c in inspector.get_columns(table)}
            if inspector.has_table(table)
            else set()
        )
        missing.extend(f"{table}.{column}" for column in wanted if column not in present)
    if missing:
        raise exc.StorageFailure(
            f"{where} has a 'logbooks' table but no flowengine revision, and is not a"
            f" TaskFlow 6.5 schema either (missing {', '.join(missing)}): refusing to"
            " migrate tables flowengine does not know"
        )
    if revision not in (None, TASKFLOW_HEAD):
        LOG.warning(
            "Adopting the TaskFlow schema of %s at TaskFlow revision %r, which"
            " TaskFlow 6.5 does not know (newer?); its tables have every column"
            " flowengine needs",
            where,
            revision,
        )
    return True
