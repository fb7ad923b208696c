"""Initial schema: logbooks, flowdetails, atomdetails.

Revision ID: 0001
Revises: none
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_UUID = 64
_NAME = 255


def upgrade() -> None:
    op.create_table(
        "logbooks",
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column("name", sa.String(_NAME)),
        sa.Column("meta", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True)),
        sa.Column("format_version", sa.Integer, nullable=False),
    )
    op.create_table(
        "flowdetails",
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column(
            "parent_uuid", sa.String(_UUID), sa.ForeignKey("logbooks.uuid", ondelete="CASCADE")
        ),
        sa.Column("name", sa.String(_NAME)),
        sa.Column("state", sa.String(_NAME)),
        sa.Column("meta", sa.Text),
        sa.Column("format_version", sa.Integer, nullable=False),
    )
    op.create_index("ix_flowdetails_parent_uuid", "flowdetails", ["parent_uuid"])
    op.create_table(
        "atomdetails",
        sa.Column("uuid", sa.String(_UUID), primary_key=True),
        sa.Column(
            "parent_uuid", sa.String(_UUID), sa.ForeignKey("flowdetails.uuid", ondelete="CASCADE")
        ),
        sa.Column("name", sa.String(_NAME)),
        sa.Column("atom_type", sa.String(_NAME)),
        sa.Column("state", sa.String(_NAME)),
        sa.Column("intention", sa.String(_NAME)),
        sa.Column("version", sa.Text),
        sa.Column("results", sa.Text),
        sa.Column("failure", sa.Text),
        sa.Column("revert_results", sa.Text),
        sa.Column("revert_failure", sa.Text),
        sa.Column("meta", sa.Text),
        sa.Column("format_version", sa.Integer, nullable=False),
    )
    op.create_index("ix_atomdetails_parent_uuid", "atomdetails", ["parent_uuid"])


def downgrade() -> None:
    op.drop_table("atomdetails")
    op.drop_table("flowdetails")
    op.drop_table("logbooks")
