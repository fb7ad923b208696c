"""JSON document columns become LONGTEXT on MySQL/MariaDB (TEXT stops at 64 KiB).

Nothing changes on SQLite or PostgreSQL, whose TEXT has no such limit.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: The document columns of each table (frozen: this revision's view of them).
_DOCUMENTS = {
    "logbooks": ("meta",),
    "flowdetails": ("meta",),
    "atomdetails": ("version", "results", "failure", "revert_results", "revert_failure", "meta"),
}


def _on_mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if not _on_mysql():
        return
    for table, columns in _DOCUMENTS.items():
        for column in columns:
            op.alter_column(table, column, type_=mysql.LONGTEXT(), existing_type=sa.Text())


def downgrade() -> None:
    if not _on_mysql():
        return
    for table, columns in _DOCUMENTS.items():
        for column in columns:
            op.alter_column(table, column, type_=sa.Text(), existing_type=mysql.LONGTEXT())
