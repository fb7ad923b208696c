"""The job machine: the moves every board makes, and the ones none may make."""

from __future__ import annotations

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import lifecycle


def test_a_job_is_claimed_then_consumed():
    state = lifecycle.advance(states.UNCLAIMED, "claim")
    assert lifecycle.advance(state, "consume") == lifecycle.CONSUMED


def test_failed_attempts_back_off_then_end_in_the_dead_letter():
    state = lifecycle.advance(states.CLAIMED, "fail")
    assert state == lifecycle.BACKING_OFF
    assert lifecycle.advance(state, "backoff_over") == states.UNCLAIMED
    assert lifecycle.advance(states.CLAIMED, "fail_last_attempt") == lifecycle.DEAD
    assert lifecycle.advance(lifecycle.DEAD, "requeue") == states.UNCLAIMED


@pytest.mark.parametrize(
    "state,event",
    [
        (lifecycle.CONSUMED, "requeue"),  # consumed is final
        (states.UNCLAIMED, "consume"),  # nobody claimed it
        (lifecycle.BACKING_OFF, "claim"),  # not before the back-off is over
        (lifecycle.TRASHED, "claim"),
    ],
)
def test_moves_no_board_may_make(state, event):
    with pytest.raises(exc.InvalidState, match=f"cannot {event}"):
        lifecycle.advance(state, event)


def test_the_machine_is_frozen():
    machine = lifecycle.build_a_machine()
    with pytest.raises(Exception):
        machine.add_state("ELSEWHERE")
