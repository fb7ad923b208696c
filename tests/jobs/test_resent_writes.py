"""A board write the server applied but never answered is recognised when sent again.

A Redis master that dies (or a connection that drops) between applying a
script and answering it makes the client send it again, now to the
promoted replica, which has it when the write waited for it. Given a
post whose first sending landed, when it is sent again, then the board
answers with the job posted once; a different posting under the same
uuid is still refused. (A finish sent again is told by the conductor from
the outcome the board kept: tests/conductors/test_conductors.py.)
"""

from __future__ import annotations

import pytest

from flowengine import exceptions as exc
from flowengine.jobs import records
from tests.jobs.boards import Boards

pytestmark = [pytest.mark.broker]


@pytest.fixture
def board(redis_url):
    boards = Boards("redis", redis_url)
    yield boards.make()
    boards.close()


def test_a_post_sent_again_after_its_answer_was_lost_posts_the_job_once(board):
    posting = records.new_posting("u-1", "resent", {"k": 1}, None, "NORMAL")
    first = board._store.post(dict(posting), max_attempts=3)
    again = board._store.post(dict(posting), max_attempts=3)
    assert again.sequence == first.sequence
    assert [job.uuid for job in board.iterjobs()] == ["u-1"]
    assert board.job_count == 1


def test_another_posting_under_a_taken_uuid_is_refused(board):
    board._store.post(records.new_posting("u-1", "first", {}, None, "NORMAL"), max_attempts=3)
    with pytest.raises(exc.JobFailure, match="u-1 could not be posted: it already exists"):
        board._store.post(records.new_posting("u-1", "second", {}, None, "NORMAL"), max_attempts=3)
    assert [job.name for job in board.iterjobs()] == ["first"]
