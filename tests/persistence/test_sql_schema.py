"""SQL backend specifics: alembic upgrades, schema checks, connection errors."""

from __future__ import annotations

import contextlib
import importlib
import io
import threading
import uuid

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.schema import CreateTable

from flowengine import exceptions as exc
from flowengine.persistence import backends, models
from flowengine.persistence.backends.sql import migration, tables

#: Bound on the start barrier of the concurrent-upgrade test.
BARRIER_TIMEOUT_S = 20.0


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request, tmp_path):
    """URL of an empty, never-upgraded database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/fresh.db"
        return
    admin = sa.create_engine(
        sa.engine.make_url(request.getfixturevalue("pg_url")).set(drivername="postgresql+psycopg"),
        isolation_level="AUTOCOMMIT",
    )
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield str(sa.engine.make_url(request.getfixturevalue("pg_url")).set(database=name))
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def _revision(url):
    be = backends.fetch(url)
    try:
        with be.engine.connect() as conn:
            return migration.current_revision(conn)
    finally:
        be.close()


def test_concurrent_upgrades_of_a_fresh_database(fresh_url):
    # Given four engines starting at once on an empty database
    barrier = threading.Barrier(4)
    errors = []

    def upgrade():
        be = backends.fetch(fresh_url)
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
            with contextlib.closing(be.get_connection()) as conn:
                conn.upgrade()
                conn.check_schema()
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            be.close()

    threads = [threading.Thread(target=upgrade) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BARRIER_TIMEOUT_S * 2)
    # Then every upgrade succeeds and the schema is at the newest revision
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert _revision(fresh_url) == migration.head_revision() == "0005"


def test_check_schema_reports_an_outdated_schema(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    with backends.backend(url) as be:
        with be.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {migration.VERSION_TABLE} SET version_num='0000'"))
        with contextlib.closing(be.get_connection()) as conn:
            with pytest.raises(exc.StorageFailure, match="revision '0000', expected '0005'"):
                conn.check_schema()


def test_in_memory_sqlite_is_shared_by_connections():
    with backends.backend("sqlite://") as be:
        book = models.LogBook("mem")
        with contextlib.closing(be.get_connection()) as conn:
            conn.save_logbook(book)
        with contextlib.closing(be.get_connection()) as conn:
            assert conn.get_logbook(book.uuid).name == "mem"


def test_unreachable_server_is_a_storage_failure_without_password():
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    be = backends.fetch("postgresql://user:s3cret@127.0.0.1:1/db?connect_timeout=5")
    try:
        with contextlib.closing(be.get_connection()) as conn:
            with pytest.raises(exc.StorageFailure) as info:
                conn.validate()
        assert "127.0.0.1:1" in str(info.value) and "s3cret" not in str(info.value)
    finally:
        be.close()


def test_missing_connection_url_is_a_value_error():
    from flowengine.persistence.backends import impl_sqlalchemy

    with pytest.raises(ValueError, match="needs a 'connection' URL"):
        impl_sqlalchemy.SQLAlchemyBackend({})


#: The tables revision 0001 created (revision 0002 widened their documents;
#: 0005 gave them TaskFlow's layout, where an atom's version is no document).
ORIGINAL_TABLES = ("logbooks", "flowdetails", "atomdetails")


def _document_columns(only=None):
    """(table, column) of every JSON document column of the current schema."""
    return {
        (table.name, column.name)
        for table in tables.METADATA.sorted_tables
        for column in table.columns
        if column.type in (tables.DOCUMENT, tables.RECORD_DOCUMENT)
        and (only is None or table.name in only)
    }


def test_document_columns_are_longtext_on_mysql():
    # Given the current schema compiled for MySQL
    ddl = "\n".join(
        str(CreateTable(table).compile(dialect=mysql_dialect.dialect()))
        for table in tables.METADATA.sorted_tables
    )
    # Then every document column is LONGTEXT (TEXT stops at 64 KiB there)
    assert ddl.count("LONGTEXT") == len(_document_columns()) == 10
    assert len(_document_columns(ORIGINAL_TABLES)) == 7
    # ...and stays plain TEXT elsewhere
    pg = "\n".join(
        str(CreateTable(table).compile(dialect=pg_dialect.dialect()))
        for table in tables.METADATA.sorted_tables
    )
    assert "LONGTEXT" not in pg


@pytest.mark.parametrize(
    "dialect_name, altered", [("mysql", True), ("sqlite", False), ("postgresql", False)]
)
def test_revision_0002_widens_documents_on_mysql_only(dialect_name, altered):
    # Given revision 0002 run offline (as SQL text) for a dialect
    module = importlib.import_module(
        "flowengine.persistence.backends.sql.migrations.versions.0002_mysql_longtext"
    )
    out = io.StringIO()
    ctx = MigrationContext.configure(
        dialect_name=dialect_name, opts={"as_sql": True, "output_buffer": out}
    )
    with Operations.context(ctx):
        module.upgrade()
    emitted = out.getvalue()
    # Then on MySQL each document column of the current schema is altered, else nothing
    if altered:
        for table, column in _document_columns(ORIGINAL_TABLES):
            assert f"ALTER TABLE {table} MODIFY {column} LONGTEXT" in emitted
    else:
        assert emitted == ""
