"""Fixtures of the jobboard tests: ``boards`` parametrised over every board kind.

``boards`` is a :class:`tests.jobs.boards.Boards` whose ``make()`` returns
connected board objects sharing one fresh namespace: memory, the session's
throwaway redis-server (``redis_url``), a SQLite file of the test, the
session's throwaway PostgreSQL (``pg_url``), or the session's throwaway
ZooKeeper (``zookeeper_url``; the namespace is a sub-path), or the
session's throwaway etcd (``etcd_url``; likewise).
"""

from __future__ import annotations

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.jobs.boards import BOARD_KINDS, Boards  # noqa: E402


def board_base_url(kind: str, request: pytest.FixtureRequest) -> str:
    """The URL of a board of ``kind`` without a namespace."""
    if kind == "memory":
        return "memory://"
    if kind == "redis":
        return request.getfixturevalue("redis_url")
    if kind == "sqlite":
        return f"sqlite:///{request.getfixturevalue('tmp_path')}/jobs.db"
    if kind == "postgresql":
        return request.getfixturevalue("pg_url")
    if kind == "zookeeper":
        return request.getfixturevalue("zookeeper_url") + "/flowengine-test/jobs"
    if kind == "etcd":
        return request.getfixturevalue("etcd_url") + "?path=flowengine-test"
    raise ValueError(kind)


@pytest.fixture(
    params=[
        pytest.param(k, marks=[pytest.mark.broker] if k != "memory" else []) for k in BOARD_KINDS
    ]
)
def boards(request: pytest.FixtureRequest) -> Boards:
    """Board objects of one kind sharing a fresh namespace."""
    made = Boards(request.param, board_base_url(request.param, request))
    yield made
    made.close()
