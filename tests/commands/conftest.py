"""Fixtures of the command tests: a durable persistence backend per kind.

- ``flows_backend``: parametrised over dir, sqlite and postgresql; the
  ``--backend`` URL of an empty store (PostgreSQL: the session's server from
  ``pg_url``, emptied for each test; skipped locally, a failure in CI,
  when PostgreSQL cannot start).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.persistence.stores import store_url

#: Backend kinds a command can share with other processes.
FLOWS_BACKENDS = ("dir", "sqlite", "postgresql")


@pytest.fixture(params=FLOWS_BACKENDS)
def flows_backend(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """``--backend`` URL of an empty store of each durable kind."""
    if request.param == "dir":
        return f"dir:{tmp_path}/store"  # the short form users type
    return store_url(request.param, tmp_path, request)
