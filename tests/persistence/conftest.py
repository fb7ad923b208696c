"""Fixtures of the persistence tests: a backend of each kind, a PostgreSQL server.

- ``pg_url`` (session): URL of a throwaway PostgreSQL cluster started for this
  session (see ``pg_server.py``), or ``FLOWENGINE_TEST_PG_URL``. Skipped with
  the reason when PostgreSQL cannot start here; a failure under ``CI=true``.
- ``backend_kind``: parametrised over memory, dir, sqlite, postgresql.
- ``store``: a :class:`Store` of that kind: ``.url``, ``.open()`` (a new
  backend object over the same data, schema upgraded), ``.backend`` (one
  opened for the test).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.persistence import pg_server  # noqa: E402
from tests.persistence.stores import (  # noqa: E402
    BACKEND_KINDS,
    DURABLE_KINDS,
    IN_CI,
    Store,
    store_url,
)


def _unavailable(reason: str) -> None:
    # A missing server is a skip locally but must fail CI (never green by skipping).
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


_PG_STATE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def pg_url(request: pytest.FixtureRequest) -> str:
    """URL of a PostgreSQL server for this session (started once, stopped at the end)."""
    url = os.environ.get("FLOWENGINE_TEST_PG_URL")
    if url:
        return url
    if "error" not in _PG_STATE and "server" not in _PG_STATE:
        try:
            server = pg_server.start()
        except pg_server.PgUnavailable as e:
            _PG_STATE["error"] = f"PostgreSQL test server unavailable: {e}"
        else:
            _PG_STATE["server"] = server
            request.addfinalizer(server.stop)
            sys.stderr.write(f"\n[postgresql] up at {server.url} in"
                             f" {server.start_time_s:.2f} s\n")
    if "error" in _PG_STATE:
        _unavailable(_PG_STATE["error"])
    return _PG_STATE["server"].url


@pytest.fixture(params=BACKEND_KINDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Each backend kind in turn."""
    return request.param


@pytest.fixture
def store(backend_kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> Any:
    """An empty store of ``backend_kind`` for this test."""
    s = Store(backend_kind, store_url(backend_kind, tmp_path, request))
    yield s
    s.close()


@pytest.fixture(params=DURABLE_KINDS)
def durable_store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """An empty store whose data outlives processes (dir, sqlite, postgresql)."""
    s = Store(request.param, store_url(request.param, tmp_path, request))
    yield s
    s.close()
