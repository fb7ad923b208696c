"""Jobboard tables: jobs (with their lease and outcome), per-namespace counters, entities.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

#: JSON documents: LONGTEXT on MySQL/MariaDB (TEXT stops at 64 KiB), as in 0002.
_DOCUMENT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_UUID = 64
_NAME = 255


def upgrade() -> None:
    op.create_table(
        "flowengine_jobs",
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column("namespace", sa.String(_NAME), nullable=False),
        sa.Column("posting", _DOCUMENT, nullable=False),
        sa.Column("sequence", sa.BigInteger, nullable=False),
        sa.Column("location", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.String(_NAME)),
        sa.Column("lease_until", sa.Float),
        sa.Column("not_before", sa.Float),
        sa.Column("outcome", _DOCUMENT),
        sa.Column("outcome_until", sa.Float),
    )
    op.create_index("flowengine_jobs_by_location", "flowengine_jobs", ["namespace", "location"])
    op.create_table(
        "flowengine_job_counters",
        sa.Column("namespace", sa.String(_NAME), primary_key=True),
        sa.Column("sequence", sa.BigInteger, nullable=False),
        sa.Column("token", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "flowengine_job_entities",
        sa.Column("namespace", sa.String(_NAME), primary_key=True),
        sa.Column("name", sa.String(_NAME), primary_key=True),
        sa.Column("entity", _DOCUMENT, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("flowengine_job_entities")
    op.drop_table("flowengine_job_counters")
    op.drop_index("flowengine_jobs_by_location", table_name="flowengine_jobs")
    op.drop_table("flowengine_jobs")
