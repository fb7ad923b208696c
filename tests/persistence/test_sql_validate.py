"""``validate()`` of an SQL connection checks the connection, as TaskFlow's does.

Octavia's ``octavia-status upgrade check`` (``Checks._check_persistence``)
fetches the persistence backend with its ``[task_flow]`` options, calls
``validate()`` on a connection and then reads ``backend.engine.dialect.name``
to warn about SQLite; its tests do this on ``sqlite://`` that nobody upgraded.
TaskFlow's ``validate()`` only connects; flowengine's used to demand the
schema, so the check answered FAILURE where TaskFlow answers WARNING
(``test__check_persistence_sqlite``, ``test__check_amphorav2_warning``).
"""

from __future__ import annotations

import contextlib
import importlib
import time

import pytest
import sqlalchemy as sa

from flowengine import exceptions as exc
from flowengine.persistence import backends
from flowengine.persistence.backends import impl_sqlalchemy

#: Octavia 19's MysqlPersistenceDriver conf with the defaults of its options.
OCTAVIA_CONF = {
    "connection": "sqlite://",
    "max_pool_size": None,
    "max_overflow": 50,
    "pool_timeout": 30,
    "idle_timeout": 3600,
    "max_retries": 10,
}


def _library(name: str):
    if name == "taskflow":
        pytest.importorskip("taskflow", reason="TaskFlow (the interop extra) is not installed")
    return importlib.import_module(f"{name}.persistence.backends")


def _octavia_status_check(library) -> str:
    """Octavia's _check_persistence, its call sequence without Octavia."""
    try:
        backend = library.fetch(dict(OCTAVIA_CONF))
        with contextlib.closing(backend):
            with contextlib.closing(backend.get_connection()) as conn:
                conn.validate()
            return "WARNING" if backend.engine.dialect.name == "sqlite" else "OK"
    except Exception:
        return "FAILURE"


@pytest.mark.parametrize("library", ["taskflow", "flowengine"])
def test_octavia_status_check_on_a_never_upgraded_sqlite_warns(library):
    # Given Octavia's persistence options on an in-memory SQLite nobody upgraded
    # When its upgrade check validates a connection and looks at the dialect
    # Then both libraries let it see SQLite (a WARNING), not a failure
    assert _octavia_status_check(_library(library)) == "WARNING"


def test_validate_ignores_the_schema_check_schema_reports_it(tmp_path):
    # Given a database file nobody has upgraded
    be = backends.fetch(f"sqlite:///{tmp_path}/new.db")
    try:
        with contextlib.closing(be.get_connection()) as conn:
            # Then validate() only connects, and check_schema() says what is missing
            conn.validate()
            with pytest.raises(exc.StorageFailure, match="revision None, expected"):
                conn.check_schema()
            conn.upgrade()
            conn.check_schema()
    finally:
        be.close()


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_validate_tries_a_refused_connection_max_retries_times():
    # Given a PostgreSQL URL where nothing listens (port 1 on loopback: refused at once)
    be = backends.fetch("postgresql://user:s3cret@127.0.0.1:1/db?connect_timeout=5")
    attempts = []
    try:
        sa.event.listen(be.engine, "do_connect", lambda *args: attempts.append(time.monotonic()))
        with contextlib.closing(be.get_connection()) as conn:
            # When validate() is given 3 attempts
            with pytest.raises(exc.StorageFailure, match="attempt 3 of 3") as info:
                conn.validate(max_retries=3)
    finally:
        be.close()
    # Then it connected three times, waiting the first wait, then twice it
    assert len(attempts) == 3
    first_wait = impl_sqlalchemy.VALIDATE_FIRST_WAIT_S
    assert attempts[1] - attempts[0] >= first_wait
    assert attempts[2] - attempts[1] >= 2 * first_wait
    assert "s3cret" not in str(info.value)
