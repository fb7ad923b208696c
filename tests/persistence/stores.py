"""Backend stores for the persistence tests (one kind of backend, fresh data each)."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any

import pytest

from flowengine.persistence import backends

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
BACKEND_KINDS = ("memory", "dir", "sqlite", "postgresql", "zookeeper")
#: Kinds whose data outlives the process (crash-resume makes sense for them).
DURABLE_KINDS = ("dir", "sqlite", "postgresql", "zookeeper")


class Store:
    """Where one test keeps its data, for one backend kind."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self._opened: list[Any] = []
        self.backend = self.open()

    def open(self) -> Any:
        """A new backend object over this store's data (schema upgraded)."""
        if self.kind == "memory" and self._opened:
            return self._opened[0]  # memory data lives in the backend object
        be = backends.fetch(self.url)
        with contextlib.closing(be.get_connection()) as conn:
            conn.upgrade()
        self._opened.append(be)
        return be

    def close(self) -> None:
        for be in self._opened:
            be.close()


def store_url(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> str:
    """Connection URL of a fresh, empty store of ``kind``."""
    if kind == "memory":
        return "memory://"
    if kind == "dir":
        return f"dir://{tmp_path}/store"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/flows.db"
    if kind == "zookeeper":
        # The session's server; a path of the test's own starts it empty.
        base = request.getfixturevalue("zookeeper_url")
        return f"{base}/flowengine-test/{uuid.uuid4().hex}"
    url = request.getfixturevalue("pg_url")
    be = backends.fetch(url)
    try:
        with contextlib.closing(be.get_connection()) as conn:
            conn.upgrade()
            conn.clear_all()  # one database for the session: start each test empty
    finally:
        be.close()
    return url
