"""A board server that goes away: blocking waits ride it out, or say why they ended.

Given a waiter in ``wait_for_outcome`` on a board whose server is down (so
its reads fail with BoardUnavailable), when the server comes back and the
job is consumed, then the waiter returns the job's outcome; when the server
stays down past the waiter's timeout, the waiter raises BoardUnavailable
rather than answering as if the job were still running.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from flowengine import exceptions as exc
from flowengine.jobs import records
from tests.jobs.boards import Boards
from tests.reliability.worker_procs import wait_until

pytestmark = [pytest.mark.broker]

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 60.0
#: The timeout of a wait that must end with the server still down (s).
SHORT_WAIT_S = 1.0

SERVERS = [
    ("redis", "persistent_redis"),
    ("zookeeper", "private_zookeeper"),
    ("etcd", "private_etcd"),
]


def _boards(request: pytest.FixtureRequest, kind: str, fixture: str) -> tuple[Any, Boards]:
    server = request.getfixturevalue(fixture)
    base = server.url + ("/flowengine-test/jobs" if kind == "zookeeper" else "")
    boards = Boards(kind, base)
    request.addfinalizer(boards.close)
    return server, boards


def _count_unreachable_reads(board: Any) -> list[BaseException]:
    """Record every BoardUnavailable the board's outcome reads raise (they still raise)."""
    seen: list[BaseException] = []
    read = board._store.outcome

    def outcome(uuid: str) -> Any:
        try:
            return read(uuid)
        except exc.BoardUnavailable as e:
            seen.append(e)
            raise

    board._store.outcome = outcome
    return seen


def _retrying(call: Any) -> Any:
    """``call()``, again while the server is still coming back (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return call()
        except exc.BoardUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("kind,fixture", SERVERS)
def test_a_waiter_rides_out_a_server_restart(request, kind, fixture):
    # Given a claimed job, and a waiter on another board object whose reads
    # fail because the server was killed
    server, boards = _boards(request, kind, fixture)
    owner, waiter = boards.make("owner"), boards.make("waiter")
    job = owner.post("outage")
    owner.claim(job, "me")
    unreachable = _count_unreachable_reads(waiter)
    server.kill()
    result: list[Any] = []
    thread = threading.Thread(
        target=lambda: result.append(waiter.wait_for_outcome(job.uuid, WAIT_S)), daemon=True
    )
    thread.start()
    wait_until(lambda: unreachable, "the waiter to find the server down", timeout=WAIT_S)
    # When the server comes back and the job is consumed
    server.start()
    _retrying(lambda: owner.consume(job, "me"))
    # Then the waiter returns the job's outcome
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the waiter did not return"
    assert [o.outcome for o in result] == [records.SUCCEEDED], result


@pytest.mark.parametrize("kind,fixture", SERVERS)
def test_a_wait_that_ends_with_the_server_down_says_so(request, kind, fixture):
    # Given a listed job, and its board's server killed
    server, boards = _boards(request, kind, fixture)
    board = boards.make()
    job = board.post("outage")
    server.kill()
    # When a wait for its outcome times out, Then it names the unreachable server
    with pytest.raises(exc.BoardUnavailable, match="unreachable"):
        board.wait_for_outcome(job.uuid, SHORT_WAIT_S)
