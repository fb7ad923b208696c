"""Tables of the SQL backend: logbooks, flowdetails and atomdetails.

The three record tables have TaskFlow 6.5's layout, column for column, so
TaskFlow can read and write a database flowengine manages (and flowengine one
TaskFlow created): names, states, times and the atom's ``version`` are
columns; results, failures and metadata are JSON documents (``JSON`` on
PostgreSQL, text elsewhere, ``LONGTEXT`` on MySQL). Times are naive UTC, as
TaskFlow writes them. flowengine's one extra is a nullable ``format_version``
column (TaskFlow never selects it and leaves it NULL, which reads as version
1, TaskFlow's layout): rows written by a newer flowengine are refused with
IncompatibleVersion instead of being misread.

This module describes the *current* schema; the alembic revisions in
``migrations/versions`` build it step by step (keep both in sync).
"""

from __future__ import annotations

from flowengine.utils import optional

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import mysql
except ImportError as e:  # the 'sql' extra is not installed
    raise optional.missing_extra("sql", e) from e

from flowengine.persistence.backends.sql import column_types

__all__ = [
    "ATOMS",
    "DOCUMENT",
    "FENCES",
    "FLOWS",
    "JOBS",
    "JOB_COUNTERS",
    "JOB_ENTITIES",
    "LOGBOOKS",
    "METADATA",
    "RECORD_DOCUMENT",
    "UUID_LENGTH",
    "VERSION_LENGTH",
]

#: uuid columns hold ``str(uuid4())`` (36 chars); 64 leaves room for other ids.
UUID_LENGTH = 64
# Names and states: long enough for generated names ("module.Class" plus
# suffixes) while still indexable on MySQL.
_NAME_LENGTH = 255
#: An atom's version string ("1.0"), TaskFlow's column length.
VERSION_LENGTH = 64

#: A JSON document column. MySQL's TEXT stops at 64 KiB, too small for the
#: results some tasks return: LONGTEXT (4 GiB) there, as TaskFlow uses.
#: SQLite's and PostgreSQL's TEXT have no such limit.
DOCUMENT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
#: A JSON document column of the record tables: as DOCUMENT, but ``JSON`` on
#: PostgreSQL (TaskFlow's type there), converted to and from text in SQL.
RECORD_DOCUMENT = column_types.JSONText()

METADATA = sa.MetaData()


def _times() -> list[sa.Column[object]]:
    """TaskFlow's created/updated columns: naive UTC datetimes."""
    return [sa.Column("created_at", sa.DateTime), sa.Column("updated_at", sa.DateTime)]


def _format_version() -> sa.Column[int]:
    # Nullable: TaskFlow's inserts leave it out (NULL reads as version 1).
    return sa.Column("format_version", sa.Integer, nullable=True)


LOGBOOKS = sa.Table(
    "logbooks",
    METADATA,
    sa.Column("uuid", sa.String(UUID_LENGTH), primary_key=True),
    sa.Column("name", sa.String(_NAME_LENGTH)),
    sa.Column("meta", RECORD_DOCUMENT),
    *_times(),
    _format_version(),
)

FLOWS = sa.Table(
    "flowdetails",
    METADATA,
    sa.Column("uuid", sa.String(UUID_LENGTH), primary_key=True),
    # Nullable: a flow detail may be saved before (or without) a logbook.
    sa.Column(
        "parent_uuid",
        sa.String(UUID_LENGTH),
        sa.ForeignKey("logbooks.uuid", ondelete="CASCADE"),
        index=True,
    ),
    sa.Column("name", sa.String(_NAME_LENGTH)),
    sa.Column("state", sa.String(_NAME_LENGTH)),
    sa.Column("meta", RECORD_DOCUMENT),
    *_times(),
    _format_version(),
)

ATOMS = sa.Table(
    "atomdetails",
    METADATA,
    sa.Column("uuid", sa.String(UUID_LENGTH), primary_key=True),
    sa.Column(
        "parent_uuid",
        sa.String(UUID_LENGTH),
        sa.ForeignKey("flowdetails.uuid", ondelete="CASCADE"),
        index=True,
    ),
    sa.Column("name", sa.String(_NAME_LENGTH)),
    # Enums on PostgreSQL when TaskFlow created the table: bound uncast.
    sa.Column("atom_type", column_types.Label(_NAME_LENGTH)),
    sa.Column("state", sa.String(_NAME_LENGTH)),
    sa.Column("intention", column_types.Label(_NAME_LENGTH)),
    sa.Column("version", sa.String(VERSION_LENGTH)),
    sa.Column("results", RECORD_DOCUMENT),
    sa.Column("failure", RECORD_DOCUMENT),
    sa.Column("revert_results", RECORD_DOCUMENT),
    sa.Column("revert_failure", RECORD_DOCUMENT),
    sa.Column("meta", RECORD_DOCUMENT),
    *_times(),
    _format_version(),
)

#: One row per fenced flow detail: the newest claim token allowed to write
#: it (see flowengine.persistence.fencing).
FENCES = sa.Table(
    "flowengine_fences",
    METADATA,
    sa.Column("name", sa.String(UUID_LENGTH), primary_key=True),
    sa.Column("token", sa.BigInteger, nullable=False),
)

#: Jobboard (flowengine.jobs.backends.impl_sqlalchemy): one row per job, its
#: posting (JSON), where it is (listed, trash, dead, consumed), its newest
#: claim (token, owner, lease end in epoch seconds of the database's clock)
#: and, once it ended, its outcome (JSON) and how long that is kept.
JOBS = sa.Table(
    "flowengine_jobs",
    METADATA,
    sa.Column("uuid", sa.String(UUID_LENGTH), primary_key=True),
    sa.Column("namespace", sa.String(_NAME_LENGTH), nullable=False),
    sa.Column("posting", DOCUMENT, nullable=False),
    sa.Column("sequence", sa.BigInteger, nullable=False),
    sa.Column("location", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("owner", sa.String(_NAME_LENGTH)),
    sa.Column("lease_until", sa.Float),
    sa.Column("not_before", sa.Float),
    sa.Column("outcome", DOCUMENT),
    sa.Column("outcome_until", sa.Float),
    sa.Index("flowengine_jobs_by_location", "namespace", "location"),
)

#: Per jobboard namespace: the last posting sequence and the last fencing token.
JOB_COUNTERS = sa.Table(
    "flowengine_job_counters",
    METADATA,
    sa.Column("namespace", sa.String(_NAME_LENGTH), primary_key=True),
    sa.Column("sequence", sa.BigInteger, nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
)

#: Entities (conductors) registered with a jobboard, until ``expires_at``.
JOB_ENTITIES = sa.Table(
    "flowengine_job_entities",
    METADATA,
    sa.Column("namespace", sa.String(_NAME_LENGTH), primary_key=True),
    sa.Column("name", sa.String(_NAME_LENGTH), primary_key=True),
    sa.Column("entity", DOCUMENT, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)
