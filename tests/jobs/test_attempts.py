"""Attempts, back-off, dead letter and outcomes, on every board kind."""

from __future__ import annotations

import threading
import time

import pytest

from flowengine import exceptions as exc
from flowengine import states

BACKOFF_S = 0.3
WAIT_S = 10.0


def _claim_when_ready(board, job, who: str, timeout_s: float = WAIT_S) -> None:
    """Claim as soon as the back-off is over (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            board.claim(job, who)
            return
        except exc.UnclaimableJob as e:
            if "backing off" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_a_failed_attempt_backs_off(boards):
    board = boards.make(backoff_s=BACKOFF_S, max_attempts=5)
    job = board.post("test")
    board.claim(job, "me")
    board.abandon(job, "me", failed=True, reason="database down")
    with pytest.raises(exc.UnclaimableJob, match="backing off"):
        board.claim(job, "me")
    _claim_when_ready(board, job, "me")
    assert job.attempt == 2


def test_a_graceful_abandon_does_not_count(boards):
    board = boards.make(max_attempts=1)
    job = board.post("test")
    for _ in range(3):
        board.claim(job, "me")
        board.abandon(job, "me")  # e.g. the conductor was stopped
    board.claim(job, "me")
    assert job.attempt == 1


def test_failed_attempts_end_in_the_dead_letter(boards):
    # Given a board allowing 2 attempts
    board = boards.make(backoff_s=0.05, max_attempts=2)
    job = board.post("poison", details={"flow_uuid": "f"})
    waiter_result = []
    t = threading.Thread(
        target=lambda: waiter_result.append(board.wait_for_outcome(job, WAIT_S)), daemon=True
    )
    t.start()
    # When both attempts fail
    board.claim(job, "me")
    board.abandon(job, "me", failed=True)
    _claim_when_ready(board, job, "me")
    board.abandon(job, "me", failed=True, reason="still broken")
    # Then it is dead-lettered, visible, with its outcome, and the poster's wait returns
    t.join(WAIT_S)
    assert job.state == states.COMPLETE
    assert [j.uuid for j in board.dead_letters()] == [job.uuid]
    assert job.outcome.outcome == "dead" and job.outcome.attempts == 2
    assert waiter_result and waiter_result[0].outcome == "dead"
    assert board.job_count == 0


def test_crashed_claims_count_and_dead_letter_on_the_next_claim(boards):
    # Given a job whose claimers keep dying (their claims simply run out)
    board = boards.make(max_attempts=2)
    job = board.post("poison")
    for _ in range(2):
        board.claim(job, "doomed", expiry=0.2)
        deadline = time.monotonic() + WAIT_S
        while job.state != states.UNCLAIMED and time.monotonic() < deadline:
            time.sleep(0.02)
    # When someone claims it a third time
    with pytest.raises(exc.UnclaimableJob, match="dead letter"):
        board.claim(job, "next")
    # Then it went to the dead letter instead
    assert job.outcome.outcome == "dead"
    assert [j.uuid for j in board.dead_letters()] == [job.uuid]


def test_requeue_from_the_dead_letter(boards):
    board = boards.make(backoff_s=0, max_attempts=1)
    job = board.post("poison")
    board.claim(job, "me")
    board.abandon(job, "me", failed=True)
    assert job.outcome.outcome == "dead"
    again = board.requeue(job)
    assert again.uuid == job.uuid and job.state == states.UNCLAIMED
    assert job.outcome is None and board.dead_letters() == []
    board.claim(job, "me")
    assert job.attempt == 1


def test_requeue_from_the_trash(boards):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me")
    board.trash(job, "me")
    board.requeue(job.uuid)
    assert job.state == states.UNCLAIMED and board.trashed() == []


def test_requeue_of_a_listed_job_is_not_found(boards):
    board = boards.make()
    job = board.post("test")
    with pytest.raises(exc.NotFound, match="neither trashed nor dead-lettered"):
        board.requeue(job)


@pytest.mark.parametrize("outcome", ["succeeded", "reverted", "failed"])
def test_consume_records_the_outcome(boards, outcome):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me")
    board.consume(job, "me", outcome=outcome, reason="why")
    found = boards.make().wait_for_outcome(job.uuid, WAIT_S)
    assert (found.outcome, found.who, found.reason) == (outcome, "me", "why")


def test_consume_refuses_an_unknown_outcome(boards):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me")
    with pytest.raises(ValueError, match="succeeded, reverted or failed"):
        board.consume(job, "me", outcome="dead")


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_waiting_for_an_outcome_does_not_poll(boards):
    # Given a poster waiting for its job's outcome, counting its reads
    poster, conductor = boards.make(), boards.make()
    job = poster.post("test")
    reads = []
    store = poster._store
    real = store.outcome
    store.outcome = lambda uuid: reads.append(uuid) or real(uuid)
    result = []
    waiting = threading.Thread(
        target=lambda: result.append(poster.wait_for_outcome(job, WAIT_S)), daemon=True
    )
    waiting.start()
    # When the job is finished a while later by another board object
    time.sleep(1.0)  # let the waiter wait: a poller would read many times meanwhile
    conductor.claim(conductor.get_job(job.uuid), "c")
    conductor.consume(conductor.get_job(job.uuid), "c")
    waiting.join(WAIT_S)
    # Then it was woken by the board's notification: a handful of reads, not a loop
    assert result and result[0].outcome == "succeeded"
    assert len(reads) <= 4, reads
