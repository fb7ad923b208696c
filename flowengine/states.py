"""State and intention names, and the transitions allowed between states.

Every state is a string whose value equals its name, as in TaskFlow, so they
persist and travel over the wire unchanged.
"""

from __future__ import annotations

from flowengine import exceptions as exc

# Job states.
CLAIMED = "CLAIMED"
COMPLETE = "COMPLETE"
UNCLAIMED = "UNCLAIMED"

# Flow states.
FAILURE = "FAILURE"
PENDING = "PENDING"
REVERTING = "REVERTING"
REVERTED = "REVERTED"
RUNNING = "RUNNING"
SUCCESS = "SUCCESS"
SUSPENDING = "SUSPENDING"
SUSPENDED = "SUSPENDED"
RESUMING = "RESUMING"

# Atom states (mostly shared with flows).
RETRYING = "RETRYING"
IGNORE = "IGNORE"
REVERT_FAILURE = "REVERT_FAILURE"

# Atom intentions (what the engine means to do with an atom next).
EXECUTE = "EXECUTE"
REVERT = "REVERT"
RETRY = "RETRY"
INTENTIONS = (EXECUTE, IGNORE, REVERT, RETRY)

# Engine (state machine) states beyond the flow states above.
SCHEDULING = "SCHEDULING"
WAITING = "WAITING"
ANALYZING = "ANALYZING"
GAME_OVER = "GAME_OVER"
UNDEFINED = "UNDEFINED"

_JOB_TRANSITIONS = frozenset(
    (
        (UNCLAIMED, CLAIMED),
        (CLAIMED, UNCLAIMED),  # lost or abandoned
        (CLAIMED, COMPLETE),
    )
)

_FLOW_TRANSITIONS = frozenset(
    (
        (PENDING, RUNNING),
        (RUNNING, SUCCESS),
        (RUNNING, FAILURE),
        (RUNNING, REVERTED),
        (RUNNING, SUSPENDING),
        (RUNNING, RESUMING),
        # A finished flow may be run again after its definition or details change.
        (SUCCESS, RUNNING),
        (FAILURE, RUNNING),
        (REVERTED, PENDING),
        (SUCCESS, PENDING),
        # While suspending, atoms still running finish and decide the outcome.
        (SUSPENDING, SUSPENDED),
        (SUSPENDING, SUCCESS),
        (SUSPENDING, FAILURE),
        (SUSPENDING, REVERTED),
        (SUSPENDING, RESUMING),
        (SUSPENDED, RUNNING),
        (RESUMING, SUSPENDED),
    )
)

# Asking a flow that is not running to suspend or resume is harmless: ignore.
_IGNORED_FLOW_TRANSITIONS = frozenset(
    (a, b)
    for a in (PENDING, FAILURE, SUCCESS, SUSPENDED, REVERTED)
    for b in (SUSPENDING, SUSPENDED, RESUMING)
    if a != b
)

_TASK_TRANSITIONS = frozenset(
    (
        (PENDING, RUNNING),
        (PENDING, IGNORE),
        (RUNNING, SUCCESS),
        (RUNNING, FAILURE),
        (FAILURE, REVERTING),
        (SUCCESS, REVERTING),
        (REVERTING, REVERTED),
        (REVERTING, REVERT_FAILURE),  # terminal
        (REVERTED, PENDING),
        (IGNORE, PENDING),
    )
)

_RETRY_TRANSITIONS = _TASK_TRANSITIONS | frozenset(
    (
        (SUCCESS, RETRYING),
        (RETRYING, RUNNING),
    )
)


def check_job_transition(old_state: str, new_state: str) -> bool:
    """Return True to perform, False to ignore; raise InvalidState if illegal."""
    if old_state == new_state:
        return False
    if (old_state, new_state) in _JOB_TRANSITIONS:
        return True
    raise exc.InvalidState(f"Job transition from '{old_state}' to '{new_state}' is not allowed")


def check_flow_transition(old_state: str, new_state: str) -> bool:
    """Return True to perform, False to ignore; raise InvalidState if illegal."""
    if old_state == new_state:
        return False
    pair = (old_state, new_state)
    if pair in _FLOW_TRANSITIONS:
        return True
    if pair in _IGNORED_FLOW_TRANSITIONS:
        return False
    raise exc.InvalidState(f"Flow transition from '{old_state}' to '{new_state}' is not allowed")


def check_task_transition(old_state: str, new_state: str) -> bool:
    """Return whether a task may go from old_state to new_state."""
    return (old_state, new_state) in _TASK_TRANSITIONS


def check_retry_transition(old_state: str, new_state: str) -> bool:
    """Return whether a retry controller may go from old_state to new_state."""
    return (old_state, new_state) in _RETRY_TRANSITIONS
