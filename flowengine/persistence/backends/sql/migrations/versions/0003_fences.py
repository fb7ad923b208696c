"""Fences: the newest claim token allowed to write each flow detail (jobboards).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_UUID = 64


def upgrade() -> None:
    op.create_table(
        "flowengine_fences",
        sa.Column("name", sa.String(_UUID), primary_key=True),
        sa.Column("token", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("flowengine_fences")
