"""Run the SQL backend's alembic migrations on a connection."""

from __future__ import annotations

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

__all__ = ["SCRIPT_LOCATION", "current_revision", "db_sync", "head_revision"]

#: Directory holding env.py and versions/.
SCRIPT_LOCATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrations")
#: The revision table (not alembic's default: never clash with an application's).
VERSION_TABLE = "flowengine_alembic_version"


def _config(connection: Any = None) -> alembic_config.Config:
    cfg = alembic_config.Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.attributes["connection"] = connection
    return cfg


def db_sync(connection: Any, revision: str = "head") -> None:
    """Upgrade the schema reached through ``connection`` to ``revision``."""
    command.upgrade(_config(connection), revision)


def head_revision() -> str | None:
    """The newest revision this flowengine knows."""
    return alembic_script.ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(connection: Any) -> str | None:
    """The revision the database is at (None if never migrated)."""
    ctx = alembic_migration.MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()
