"""Tests for states and their transition tables."""

import pytest

from flowengine import exceptions as exc
from flowengine import states as st


def test_state_values_equal_their_names():
    names = [
        "PENDING",
        "RUNNING",
        "SUCCESS",
        "FAILURE",
        "REVERTED",
        "SUSPENDING",
        "SUSPENDED",
        "RESUMING",
        "REVERTING",
        "REVERT_FAILURE",
        "RETRYING",
        "IGNORE",
        "EXECUTE",
        "REVERT",
        "RETRY",
        "SCHEDULING",
        "WAITING",
        "ANALYZING",
        "GAME_OVER",
        "UNDEFINED",
    ]
    for name in names:
        assert getattr(st, name) == name
    assert set(st.INTENTIONS) == {"EXECUTE", "IGNORE", "REVERT", "RETRY"}


@pytest.mark.parametrize(
    "old,new",
    [
        (st.PENDING, st.RUNNING),
        (st.RUNNING, st.SUCCESS),
        (st.RUNNING, st.FAILURE),
        (st.RUNNING, st.REVERTED),
        (st.RUNNING, st.SUSPENDING),
        (st.SUSPENDING, st.SUSPENDED),
        (st.SUSPENDED, st.RUNNING),
        (st.REVERTED, st.PENDING),
        (st.RESUMING, st.SUSPENDED),
    ],
)
def test_flow_allowed(old, new):
    assert st.check_flow_transition(old, new) is True


@pytest.mark.parametrize(
    "old,new",
    [
        (st.RUNNING, st.RUNNING),
        (st.PENDING, st.SUSPENDING),
        (st.SUCCESS, st.SUSPENDED),
        (st.REVERTED, st.RESUMING),
    ],
)
def test_flow_ignored(old, new):
    assert st.check_flow_transition(old, new) is False


@pytest.mark.parametrize(
    "old,new",
    [
        (st.PENDING, st.SUCCESS),
        (st.SUCCESS, st.FAILURE),
        (st.SUSPENDED, st.SUCCESS),
    ],
)
def test_flow_illegal_raises(old, new):
    with pytest.raises(exc.InvalidState) as info:
        st.check_flow_transition(old, new)
    assert f"'{old}' to '{new}'" in str(info.value)


def test_task_transitions():
    assert st.check_task_transition(st.PENDING, st.RUNNING)
    assert st.check_task_transition(st.PENDING, st.IGNORE)
    assert st.check_task_transition(st.REVERTING, st.REVERT_FAILURE)
    assert st.check_task_transition(st.IGNORE, st.PENDING)
    assert not st.check_task_transition(st.SUCCESS, st.RETRYING)
    assert not st.check_task_transition(st.REVERT_FAILURE, st.PENDING)
    assert not st.check_task_transition(st.RUNNING, st.RUNNING)


def test_retry_transitions_extend_task_ones():
    assert st.check_retry_transition(st.SUCCESS, st.RETRYING)
    assert st.check_retry_transition(st.RETRYING, st.RUNNING)
    assert st.check_retry_transition(st.PENDING, st.RUNNING)
    assert not st.check_retry_transition(st.RETRYING, st.SUCCESS)


def test_job_transitions():
    assert st.check_job_transition(st.UNCLAIMED, st.CLAIMED)
    assert st.check_job_transition(st.CLAIMED, st.CLAIMED) is False
    with pytest.raises(exc.InvalidState):
        st.check_job_transition(st.COMPLETE, st.CLAIMED)
