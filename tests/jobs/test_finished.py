"""Finished jobs can be listed: consumed jobs whose outcome a board still keeps, newest first.

On every board kind, and on the Redis and ZooKeeper boards in TaskFlow's
layout (``compat='taskflow'``), where flowengine keeps what it consumed
beside TaskFlow's keys.
"""

from __future__ import annotations

import pytest

from tests import waiting
from tests.jobs.boards import Boards


def _finish_some(board):
    """Post four jobs: consume two (succeeded, then reverted), trash one, leave one listed."""
    ok, bad, junk, waiting = (board.post(name) for name in ("ok", "bad", "junk", "waiting"))
    for job in (ok, bad, junk):
        board.claim(job, "worker-1")
    board.consume(ok, "worker-1")
    board.consume(bad, "worker-1", outcome="reverted", reason="card declined")
    board.trash(junk, "worker-1", reason="unreadable")
    return ok, bad, waiting


def _check_listing(reader, ok, bad):
    found = reader.finished()
    # Newest first; trashed and listed jobs are not finished ones.
    assert [(job.uuid, done.outcome) for job, done in found] == [
        (bad.uuid, "reverted"),
        (ok.uuid, "succeeded"),
    ]
    job, done = found[0]
    assert job.name == "bad" and done.who == "worker-1" and done.attempts == 1
    assert done.reason == "card declined" and done.at > 0
    assert [job.uuid for job, _ in reader.finished(limit=1)] == [bad.uuid]
    assert reader.finished(limit=0) == []


def test_finished_jobs_are_listed_newest_first(boards):
    ok, bad, _waiting = _finish_some(boards.make())
    _check_listing(boards.make(), ok, bad)  # read by another board object: from the server


def test_a_board_with_nothing_finished_lists_nothing(boards):
    board = boards.make()
    board.post("waiting")
    assert board.finished() == []


def test_a_finished_job_is_listed_only_while_its_outcome_is_kept(boards):
    # Given one job consumed with an outcome kept a minute, one kept a second
    kept, brief = boards.make(outcome_ttl_s=60), boards.make(outcome_ttl_s=1)
    for board, name in ((kept, "kept"), (brief, "brief")):
        job = board.post(name)
        board.claim(job, "me")
        board.consume(job, "me")
    # When the short one's outcome expires, then only the other is listed
    waiting.wait_until(
        lambda: [j.name for j, _ in kept.finished()] == ["kept"],
        "the expired job to leave the finished listing",
        poll_s=0.1,
    )


@pytest.mark.broker
@pytest.mark.parametrize("kind", ["redis", "zookeeper"])
def test_compat_taskflow_layouts_list_what_flowengine_consumed(kind, request):
    pytest.importorskip(
        "msgpack", reason="msgpack is not installed (pip install -e .[taskflow-compat])"
    )
    base = (
        request.getfixturevalue("redis_url")
        if kind == "redis"
        else request.getfixturevalue("zookeeper_url") + "/flowengine-test/tfjobs"
    )
    boards = Boards(kind, base + "?compat=taskflow")
    try:
        ok, bad, _waiting = _finish_some(boards.make())
        _check_listing(boards.make(), ok, bad)
    finally:
        boards.close()
