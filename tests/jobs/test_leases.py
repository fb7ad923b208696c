"""Leases and fencing on every board kind: claims expire, tokens grow, stale ones are refused."""

from __future__ import annotations

import threading
import time

import pytest

from flowengine import exceptions as exc
from flowengine import states
from tests.jobs.boards import LEASE_UNIT_S
from tests.waiting import holds_within

#: Short leases so the tests wait little; still 10x a loopback round trip.
LEASE_S = 0.5
WAIT_S = 10.0


def _die(board) -> None:
    """Simulate the claimer's death: its keeper stops renewing, nothing is given back."""
    board._keeper.stop()


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_the_keeper_keeps_a_claim_alive(boards):
    # Given a job claimed on a board with a short lease
    board = boards.make(lease_s=LEASE_S)
    job = board.post("test")
    board.claim(job, "me")
    # When several leases' worth of time passes
    time.sleep(4 * LEASE_S)
    # Then the keeper renewed it: still ours
    assert job.state == states.CLAIMED and board.find_owner(job) == "me"


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_a_dead_claimers_lease_runs_out(boards):
    # Given a job claimed by a board that then dies
    dead = boards.make(lease_s=LEASE_S)
    job = dead.post("test")
    dead.claim(job, "dead")
    _die(dead)
    # Then within the lease (plus slack) the job is claimable again
    rival = boards.make(lease_s=LEASE_S)
    assert holds_within(lambda: rival.job_state(job) == states.UNCLAIMED, 3 * LEASE_S + 2)
    assert rival.find_owner(job) is None


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_explicit_expiry_is_not_renewed(boards):
    # TaskFlow's Redis board: claim(..., expiry=s) simply runs out
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me", expiry=LEASE_S)
    remaining = job.expires_in()
    granted = max(LEASE_S, LEASE_UNIT_S.get(boards.kind, 0.0))  # etcd: at least 2 s
    assert remaining is not None and 0 < remaining <= granted
    assert holds_within(lambda: job.state == states.UNCLAIMED, 3 * granted + 2)
    assert job.expires_in() is None


def test_extend_expiry(boards):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me", expiry=LEASE_S)
    assert job.extend_expiry(30.0)
    assert job.expires_in() > LEASE_S


def test_tokens_grow_with_every_claim_on_the_board(boards):
    board = boards.make()
    first, second = board.post("a"), board.post("b")
    board.claim(first, "me")
    board.claim(second, "me")
    board.abandon(first, "me")
    token_before = first.token
    board.claim(first, "me")
    assert second.token > token_before and first.token > second.token


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_reclaim_fences_out_the_old_claimer(boards):
    # Given a claimer paused past its lease and another that claimed the job since
    old = boards.make(lease_s=LEASE_S)
    job = old.post("test")
    old.claim(job, "old")
    _die(old)
    new = boards.make(lease_s=LEASE_S)
    assert holds_within(lambda: new.job_state(job) == states.UNCLAIMED, 3 * LEASE_S + 2)
    theirs = new.get_job(job.uuid)
    new.claim(theirs, "new")
    assert theirs.token > job.token
    # When the old claimer wakes up, every finishing move is refused
    for finish in (old.consume, old.abandon, old.trash):
        with pytest.raises(exc.ClaimLost):
            finish(job, "old")
    # Even under the new owner's name: the token decides, not the name
    with pytest.raises(exc.ClaimLost):
        old.consume(job, "new")
    # And the new owner consumes it exactly once
    new.consume(theirs, "new")
    assert job.outcome.who == "new" and job.outcome.token == theirs.token


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_a_lapsed_lease_nobody_took_is_taken_back(boards):
    # Given a claim whose renewals stopped long enough for its lease to lapse
    board = boards.make(lease_s=LEASE_S)
    job = board.post("test")
    board.claim(job, "me", expiry=LEASE_S)
    assert holds_within(lambda: job.state == states.UNCLAIMED, 3 * LEASE_S + 2)
    # When its holder renews it before anyone claimed it
    assert job.extend_expiry(30.0)
    # Then it holds again, and it may still consume
    assert job.state == states.CLAIMED
    board.consume(job, "me")
    assert job.outcome.outcome == "succeeded"


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_the_keeper_reports_a_lost_lease(boards):
    # Given a board holding a claim whose renewals are cut off (partition)
    board = boards.make(lease_s=LEASE_S)
    job = board.post("test")
    lost = []
    board.claim(job, "me")
    board.on_claim_lost(job, lost.append)
    store = board._store
    renew = store.renew
    store.renew = lambda held, lease_s: (_ for _ in ()).throw(exc.BoardUnavailable("cut off"))
    # When another board claims it after the lease ran out
    rival = boards.make(lease_s=LEASE_S)
    assert holds_within(lambda: rival.job_state(job) == states.UNCLAIMED, 3 * LEASE_S + 2)
    rival.claim(rival.get_job(job.uuid), "rival")
    # And the partition heals
    store.renew = renew
    # Then the keeper learns the lease is gone and says so
    assert holds_within(lambda: job.lost.is_set(), 3 * LEASE_S + 2)
    assert lost == [job]


def test_a_renewal_that_crosses_the_consume_of_its_job_is_no_loss(boards):
    # Given a claimed job whose keeper sent a renewal that reaches the server
    # only after the job was consumed (it finds the lease gone)
    board = boards.make(lease_s=LEASE_S)
    job = board.post("test")
    board.claim(job, "me")
    lost: list = []
    board.on_claim_lost(job, lost.append)
    store, keeper = board._store, board._keeper
    renewing, finished, renewal_handled = threading.Event(), threading.Event(), threading.Event()
    real_renew, real_finish, real_batch = store.renew, store.finish, keeper._renew_batch

    def renew(held, lease_s):
        renewing.set()
        finished.wait(WAIT_S)  # the consume goes first
        return real_renew(held, lease_s)

    def renew_batch(batch):
        real_batch(batch)
        renewal_handled.set()

    def finish(*args, **kwargs):
        done = real_finish(*args, **kwargs)
        finished.set()
        renewal_handled.wait(WAIT_S)  # the renewal's answer is handled before we go on
        return done

    store.renew, store.finish, keeper._renew_batch = renew, finish, renew_batch
    assert renewing.wait(WAIT_S), "the keeper did not renew"
    # When the job is consumed meanwhile
    board.consume(job, "me")
    # Then the claim was not reported lost: it ended by our own consume
    assert renewal_handled.is_set()
    assert lost == []
    assert job.state == states.COMPLETE
