"""Fixtures of the persistence tests: a backend of each kind, a PostgreSQL server.

- ``pg_url`` (session, in ``tests/conftest.py``): URL of a throwaway
  PostgreSQL cluster started for this session (see ``pg_server.py``), or
  ``FLOWENGINE_TEST_PG_URL``. Skipped with the reason when PostgreSQL cannot
  start here; a failure under ``CI=true``.
- ``backend_kind``: parametrised over memory, dir, sqlite, postgresql, zookeeper
  (the session's throwaway ZooKeeper, a fresh path per test).
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

from tests.persistence.stores import (  # noqa: E402
    BACKEND_KINDS,
    DURABLE_KINDS,
    Store,
    store_url,
)


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
    """An empty store whose data outlives processes (dir, sqlite, postgresql, zookeeper)."""
    s = Store(request.param, store_url(request.param, tmp_path, request))
    yield s
    s.close()
