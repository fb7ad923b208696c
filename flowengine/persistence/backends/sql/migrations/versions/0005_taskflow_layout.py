"""The record tables take TaskFlow 6.5's layout, so TaskFlow can share the database.

Two kinds of database reach this revision:

- flowengine's own (revisions 0001-0004): flow and atom details gain
  ``created_at``/``updated_at``; ``format_version`` becomes nullable
  (TaskFlow's inserts leave it out); an atom's ``version`` becomes a plain
  string column (it was a JSON document); on PostgreSQL the documents become
  ``JSON`` and the logbook times ``timestamp without time zone`` (UTC);
  TaskFlow's alembic revision is recorded (below).
- a TaskFlow database adopted by ``upgrade()`` (stamped at the baseline, see
  ``migration.py``): it has the layout already and only gains the nullable
  ``format_version``.

Either way the parent_uuid indexes flowengine's queries use are created when
missing. SQLite cannot alter a column: ``format_version`` and ``version``
are copied into new columns that take their names (SQLite 3.35+); no table
is rebuilt, as rebuilding a table its children reference would
cascade-delete them. On PostgreSQL ``atom_type`` and ``intention`` stay
``VARCHAR`` where TaskFlow's are enums: each library writes values the other
accepts.

TaskFlow keeps its revision in alembic's default table ``alembic_version``.
When that table does not exist, it is created holding TaskFlow 6.5's head, so
TaskFlow's own ``upgrade()`` finds its schema current instead of trying to
create the tables again. An existing ``alembic_version`` (TaskFlow's or an
application's) is left as it is.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from flowengine import exceptions as exc

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

#: TaskFlow 6.5's newest alembic revision (the layout this revision matches).
TASKFLOW_HEAD = "00af93df9d77"
#: alembic's default revision table, where TaskFlow keeps its revision.
TASKFLOW_VERSION_TABLE = "alembic_version"
_VERSION_LENGTH = 64
_TABLES = ("logbooks", "flowdetails", "atomdetails")
#: The JSON document columns of each record table (this revision's view).
_DOCUMENTS = {
    "logbooks": ("meta",),
    "flowdetails": ("meta",),
    "atomdetails": ("results", "failure", "revert_results", "revert_failure", "meta"),
}
_INDEXED_PARENTS = ("flowdetails", "atomdetails")


def _columns(table: str) -> dict[str, Any]:
    """Each column of ``table``, by name, as the database describes it now."""
    inspector = sa.inspect(op.get_bind())
    return {column["name"]: column for column in inspector.get_columns(table)}


def _dialect() -> str:
    return str(op.get_bind().dialect.name)


def upgrade() -> None:
    native = "format_version" in _columns("atomdetails")
    for table in _TABLES:
        columns = _columns(table)
        for name in ("created_at", "updated_at"):
            if name not in columns:
                op.add_column(table, sa.Column(name, sa.DateTime, nullable=True))
        if "format_version" not in columns:
            op.add_column(table, sa.Column("format_version", sa.Integer, nullable=True))
        elif not columns["format_version"]["nullable"]:
            _make_nullable(table)
    if native:
        _version_to_text()
        if _dialect() == "postgresql":
            _postgresql_types()
    if _dialect() in ("mysql", "mariadb"):
        _mysql_documents()
    _index_parents()
    _record_taskflow_revision()


def _make_nullable(table: str) -> None:
    if _dialect() == "sqlite":
        _sqlite_retype(table, "format_version", sa.Integer())
    else:
        op.alter_column(table, "format_version", existing_type=sa.Integer, nullable=True)


#: SQLite's first release with ALTER TABLE ... DROP COLUMN.
_SQLITE_DROP_COLUMN = (3, 35, 0)


def _sqlite_retype(table: str, column: str, type_: sa.types.TypeEngine[Any]) -> None:
    """SQLite has no ALTER COLUMN: copy into a new nullable column, swap names."""
    version = op.get_bind().dialect.dbapi.sqlite_version_info  # type: ignore[union-attr]
    if tuple(version) < _SQLITE_DROP_COLUMN:
        raise exc.StorageFailure(
            f"Migrating {table}.{column} needs SQLite 3.35 or newer (ALTER TABLE DROP"
            f" COLUMN); this Python's sqlite3 is {'.'.join(map(str, version))}"
        )
    new = f"{column}_retyped"
    op.add_column(table, sa.Column(new, type_, nullable=True))
    op.execute(f"UPDATE {table} SET {new} = {column}")
    op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    op.execute(f"ALTER TABLE {table} RENAME COLUMN {new} TO {column}")


def _version_to_text() -> None:
    """flowengine stored the version as a JSON document ('"1.0"'); TaskFlow as '1.0'."""
    bind = op.get_bind()
    atoms = sa.table("atomdetails", sa.column("uuid", sa.String), sa.column("version", sa.Text))
    changed = []
    for uuid, text in bind.execute(
        sa.select(atoms.c.uuid, atoms.c.version).where(atoms.c.version.is_not(None))
    ):
        # Only a JSON string or list is flowengine's encoding: '1.10' written
        # plain (by TaskFlow) must not be read as the number 1.1.
        if not text.startswith(('"', "[")):
            continue
        try:
            value = json.loads(text)
        except ValueError:
            continue  # plain text that merely starts like JSON
        plain = ".".join(str(v) for v in value) if isinstance(value, list) else str(value)
        changed.append({"key": uuid, "plain": plain})
    if changed:
        bind.execute(
            atoms.update()
            .where(atoms.c.uuid == sa.bindparam("key"))
            .values(version=sa.bindparam("plain")),
            changed,
        )
    if _dialect() == "sqlite":
        _sqlite_retype("atomdetails", "version", sa.String(_VERSION_LENGTH))
    else:
        op.alter_column(
            "atomdetails", "version", type_=sa.String(_VERSION_LENGTH), existing_type=sa.Text
        )


def _postgresql_types() -> None:
    for table, columns in _DOCUMENTS.items():
        for column in columns:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE JSON USING {column}::json")
    for column in ("created_at", "updated_at"):
        op.execute(
            f"ALTER TABLE logbooks ALTER COLUMN {column} TYPE TIMESTAMP"
            f" WITHOUT TIME ZONE USING {column} AT TIME ZONE 'UTC'"
        )


def _mysql_documents() -> None:
    # TaskFlow widened only some of them; flowengine's results may be large anywhere.
    for table, columns in _DOCUMENTS.items():
        for column in columns:
            op.alter_column(table, column, type_=mysql.LONGTEXT(), existing_nullable=True)


def _index_parents() -> None:
    inspector = sa.inspect(op.get_bind())
    for table in _INDEXED_PARENTS:
        indexed = {tuple(index["column_names"]) for index in inspector.get_indexes(table)}
        if ("parent_uuid",) not in indexed:
            op.create_index(f"ix_{table}_parent_uuid", table, ["parent_uuid"])


def _record_taskflow_revision() -> None:
    if sa.inspect(op.get_bind()).has_table(TASKFLOW_VERSION_TABLE):
        return
    version_table = op.create_table(
        TASKFLOW_VERSION_TABLE,
        sa.Column("version_num", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
    )
    op.bulk_insert(version_table, [{"version_num": TASKFLOW_HEAD}])


def downgrade() -> None:
    raise NotImplementedError(
        "Revision 0005 (TaskFlow's layout) cannot be undone: the databases it"
        " migrates may be shared with TaskFlow, which needs this layout"
    )
