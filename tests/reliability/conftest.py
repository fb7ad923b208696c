"""Fixtures of the fault tests: one real broker per parameter, a records file."""

from __future__ import annotations

import pytest

from tests.reliability.harness import Conn

FAULT_BROKERS = [
    "filesystem",
    pytest.param("redis", marks=pytest.mark.broker),
    pytest.param("amqp", marks=pytest.mark.broker),
]


@pytest.fixture(params=FAULT_BROKERS)
def conn(request: pytest.FixtureRequest, tmp_path) -> Conn:
    """Where worker processes and the test's executor meet (shared by processes)."""
    kind = request.param
    if kind == "filesystem":
        folder = tmp_path / "broker"
        folder.mkdir()
        return Conn(kind, transport="filesystem", transport_options={"data_folder": str(folder)})
    if kind == "redis":
        return Conn(kind, url=request.getfixturevalue("redis_url"))
    return Conn(kind, url=request.getfixturevalue("amqp_url"))
