"""The etcd board's own promises, on a real etcd (the behaviour suite runs on it too).

TaskFlow's configuration keys build it; a claim is an etcd lease that etcd
itself ends when its owner stops renewing, which wakes the other boards
through their watch; the stale owner is fenced; and TaskFlow 6.5's etcd
board on the same etcd and path does not meet it.
"""

from __future__ import annotations

import uuid
from urllib import parse

import pytest

from flowengine import exceptions as exc
from flowengine.jobs import backends, records
from tests import brokers

pytestmark = [pytest.mark.broker]

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 20.0


@pytest.fixture
def etcd_port(etcd_url: str) -> int:
    port = parse.urlsplit(etcd_url).port
    assert port is not None
    return port


@pytest.fixture
def conf(etcd_port: int) -> dict:
    """TaskFlow's keys for a board on the session's etcd, on a path of this test's own."""
    return {
        "board": "etcd",
        "host": "127.0.0.1",
        "port": etcd_port,
        "path": f"test-{uuid.uuid4().hex[:12]}",
    }


def _raw_keys(port: int, prefix: str) -> list[str]:
    etcd3gw = pytest.importorskip("etcd3gw")
    client = etcd3gw.Etcd3Client(host="127.0.0.1", port=port)
    return sorted(meta["key"].decode() for _value, meta in client.get_prefix(prefix))


def _board(conf: dict, **extra) -> object:
    board = backends.fetch("etcd-test", {**conf, **extra})
    board.connect()
    return board


def test_taskflow_keys_build_the_board_and_ttl_is_the_lease(conf, etcd_port):
    board = _board(conf, ttl=3)
    try:
        assert type(board).__name__ == "EtcdJobBoard"
        assert board.root_path == f"/flowengine/jobs/{conf['path']}"
        assert board.policy.lease_s == 3.0
        job = board.post("test", details={"a": 1})
        board.claim(job, "me")
        assert _raw_keys(etcd_port, board.root_path + "/") == [
            f"{board.root_path}/listed/{job.uuid}",
            f"{board.root_path}/locks/{job.uuid}",
        ]
        assert 0 < board.lease_remaining(job) <= 3.0
    finally:
        board.close()


def test_an_owner_that_stops_renewing_loses_the_job_and_is_fenced(conf, etcd_port):
    # Given a job claimed by a board whose keeper then stops (a dead owner)
    stale = _board(conf, lease_s=1)
    rival = _board(conf, lease_s=1)
    try:
        job = stale.post("test")
        seen = rival.change_seq
        stale.claim(job, "stale")
        stale._keeper.stop()
        lock = f"{stale.root_path}/locks/{job.uuid}"
        # When etcd ends its lease: the lock key is deleted by etcd itself,
        # and the rival is woken by its watch (RELEASED), not by polling
        while rival.find_owner(job) is not None:
            assert rival.wait_for_change(seen, WAIT_S), "no board event within the bound"
            seen = rival.change_seq
        assert lock not in _raw_keys(etcd_port, stale.root_path + "/")
        # Then another claimer takes it, and the stale owner cannot consume it
        theirs = rival.get_job(job.uuid)
        rival.claim(theirs, "rival")
        assert theirs.token > job.token
        with pytest.raises(exc.ClaimLost):
            stale.consume(job, "stale")
        rival.consume(theirs, "rival")
        outcome = rival.wait_for_outcome(job.uuid, WAIT_S)
        assert outcome is not None and outcome.who == "rival"
        assert outcome.outcome == records.SUCCEEDED
    finally:
        stale.close()
        rival.close()


def test_an_unreachable_etcd_is_named():
    board = backends.fetch(
        "etcd-test",
        {"board": "etcd", "host": "127.0.0.1", "port": brokers.free_port(), "timeout": 2},
    )
    with pytest.raises(exc.BoardUnavailable, match="127.0.0.1"):
        board.connect()


def test_taskflow_and_flowengine_boards_share_an_etcd_without_meeting(conf, etcd_port):
    pytest.importorskip("taskflow", reason="TaskFlow 6.5 is the other side (interop extra)")
    from taskflow.jobs.backends import impl_etcd as tf_etcd

    tf_conf = {"host": "127.0.0.1", "port": etcd_port, "path": conf["path"]}
    theirs = tf_etcd.EtcdJobBoard("taskflow", tf_conf)
    ours = _board(conf)
    theirs.connect()
    try:
        theirs.post("posted-by-taskflow")
        ours.post("posted-by-flowengine")
        # Each lists only its own job: other root, other layout
        assert [j.name for j in ours.iterjobs(ensure_fresh=True)] == ["posted-by-flowengine"]
        assert [j.name for j in theirs.iterjobs(ensure_fresh=True)] == ["posted-by-taskflow"]
    finally:
        theirs.close()
        ours.close()
