"""The life of a job on a board, declared as an automaton machine.

Every backend moves its jobs through this machine (each in its own atomic
operations); the memory board checks each move against it, and the docs
print its table from here. TaskFlow's ``Job.state`` maps UNCLAIMED and
BACKING_OFF to UNCLAIMED, CLAIMED to CLAIMED, and every final state to
COMPLETE.
"""

from __future__ import annotations

from automaton import machines

from flowengine import exceptions as exc
from flowengine import states

__all__ = [
    "BACKING_OFF",
    "CONSUMED",
    "DEAD",
    "TRANSITIONS",
    "TRASHED",
    "advance",
    "build_a_machine",
]

#: Given back after a failed attempt: claimable once the back-off is over.
BACKING_OFF = "BACKING_OFF"
#: Final states (``requeue`` brings DEAD and TRASHED jobs back).
CONSUMED = "CONSUMED"
TRASHED = "TRASHED"
DEAD = "DEAD"

_MOVES = (
    (states.UNCLAIMED, "claim", states.CLAIMED),
    # Claimed max_attempts times without finishing: the next claim buries it.
    (states.UNCLAIMED, "too_many_attempts", DEAD),
    (states.CLAIMED, "renew", states.CLAIMED),
    # Its claimer died or was cut off; nobody claimed it since (renew takes it back).
    (states.CLAIMED, "lease_ran_out", states.UNCLAIMED),
    (states.CLAIMED, "abandon", states.UNCLAIMED),
    (states.CLAIMED, "fail", BACKING_OFF),
    (states.CLAIMED, "fail_last_attempt", DEAD),
    (states.CLAIMED, "consume", CONSUMED),
    (states.CLAIMED, "trash", TRASHED),
    (BACKING_OFF, "backoff_over", states.UNCLAIMED),
    (DEAD, "requeue", states.UNCLAIMED),
    (TRASHED, "requeue", states.UNCLAIMED),
)


def build_a_machine(freeze: bool = True) -> machines.FiniteMachine:
    """Build the machine every job goes through (posted: UNCLAIMED)."""
    m = machines.FiniteMachine()
    for state in (states.UNCLAIMED, states.CLAIMED, BACKING_OFF, DEAD, TRASHED):
        m.add_state(state)
    m.add_state(CONSUMED, terminal=True)
    m.default_start_state = states.UNCLAIMED
    for source, event, target in _MOVES:
        m.add_transition(source, target, event)
    if freeze:
        m.freeze()
    return m


#: (state, event) -> state, read off the frozen machine.
TRANSITIONS: dict[tuple[str, str], str] = {(s, e): t for s, e, t in build_a_machine()}


def advance(state: str, event: str) -> str:
    """The state ``event`` moves a job in ``state`` to; InvalidState if it cannot."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise exc.InvalidState(f"A job in state {state} cannot {event}") from None
