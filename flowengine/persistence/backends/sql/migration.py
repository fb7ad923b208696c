"""Run the SQL backend's alembic migrations on a connection.

flowengine's revisions are recorded in ``flowengine_alembic_version``,
TaskFlow's in alembic's default ``alembic_version``: two histories side by
side in one database, never one table for both. A database TaskFlow created
(record tables present, no flowengine revision) is adopted: stamped at
:data:`TASKFLOW_BASELINE`, then migrated like any other (revision 0005 gives
it flowengine's nullable ``format_version`` column and leaves TaskFlow's
revision alone, so TaskFlow's own ``upgrade()`` still finds it current).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flowengine.utils import optional

try:
    from alembic import command
    from alembic import config as alembic_config
    from alembic import migration as alembic_migration
    from alembic import script as alembic_script
except ImportError as e:  # the 'sql' extra is not installed
    raise optional.missing_extra("sql", e) from e

from flowengine.persistence.backends.sql import taskflow_schema

__all__ = ["SCRIPT_LOCATION", "TASKFLOW_BASELINE", "current_revision", "db_sync", "head_revision"]

LOG = logging.getLogger(__name__)

#: Directory holding env.py and versions/.
SCRIPT_LOCATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrations")
#: The revision table (not alembic's default: never clash with an application's).
VERSION_TABLE = "flowengine_alembic_version"
#: flowengine's revision a TaskFlow 6.5 schema is stamped at: its record
#: tables exist (0001, 0002); the revisions after it add flowengine's own
#: tables (0003, 0004) and bring the record tables to TaskFlow's layout with
#: flowengine's extra column (0005, which sees what is there already).
TASKFLOW_BASELINE = "0002"


def _config(connection: Any = None) -> alembic_config.Config:
    cfg = alembic_config.Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.attributes["connection"] = connection
    return cfg


def db_sync(connection: Any, revision: str = "head", where: str = "the database") -> None:
    """Upgrade the schema reached through ``connection`` to ``revision``.

    A TaskFlow schema is adopted first (see the module doc); StorageFailure
    names ``where`` when it is too old or not TaskFlow's.
    """
    if current_revision(connection) is None and taskflow_schema.check_adoptable(connection, where):
        LOG.info(
            "Adopting the TaskFlow schema of %s (TaskFlow revision %s): stamped at"
            " flowengine revision %s, then migrated",
            where,
            taskflow_schema.taskflow_revision(connection) or "none recorded",
            TASKFLOW_BASELINE,
        )
        command.stamp(_config(connection), TASKFLOW_BASELINE)
    command.upgrade(_config(connection), revision)


def head_revision() -> str | None:
    """The newest revision this flowengine knows."""
    return alembic_script.ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(connection: Any) -> str | None:
    """The revision the database is at (None if never migrated)."""
    ctx = alembic_migration.MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE}
    )
    return ctx.get_current_revision()
