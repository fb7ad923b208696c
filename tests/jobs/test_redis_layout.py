"""The Redis board's own layout: where it lists jobs, and what it does with others' postings."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
import redis

from flowengine.jobs import backends

pytestmark = pytest.mark.broker


def test_postings_of_flowengine_0_1_are_moved_out_of_taskflows_listings_key(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # Given flowengine 0.1.0's posting in <ns>:listings (TaskFlow's key), next
    # to a posting that is not JSON (TaskFlow's msgpack: a map starts 0x8N)
    namespace = f"legacy-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    old_uuid, foreign_uuid = str(uuid.uuid4()), str(uuid.uuid4())
    posting = {"uuid": old_uuid, "name": "old-job", "priority": "NORMAL", "details": {},
               "created_on": "2026-01-01T00:00:00"}
    client.hset(f"{namespace}:listings", old_uuid, json.dumps(posting))
    client.hset(f"{namespace}:listings", foreign_uuid, b"\x84\xa4uuid\xa0")
    client.hset(f"{namespace}:state:{old_uuid}", mapping={"sequence": 1, "attempts": 0,
                                                          "token": 0})
    caplog.set_level(logging.INFO, logger="flowengine.jobs.backends.impl_redis")
    # When this release's board connects
    board = backends.fetch("b", {"board": redis_url, "namespace": namespace})
    board.connect()
    try:
        # Then the old job is listed (and claimable), the foreign posting is left alone
        assert [j.uuid for j in board.iterjobs()] == [old_uuid]
        board.claim(board.get_job(old_uuid), "c")
        board.consume(board.get_job(old_uuid), "c")
        assert client.hkeys(f"{namespace}:listings") == [foreign_uuid.encode()]
        assert any("Moved 1 job posting" in r.getMessage() for r in caplog.records)
    finally:
        board.close()
        client.close()
