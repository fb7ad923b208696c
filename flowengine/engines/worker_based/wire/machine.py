"""The state machine every remote request goes through (WAITING to SUCCESS/FAILURE).

Declared with automaton and frozen; :data:`TRANSITIONS` is the same table
read off the frozen machine once, so a request moves by a dict lookup
instead of owning a machine of its own.
"""

from __future__ import annotations

from automaton import machines

from flowengine.engines.worker_based.wire.names import (
    FAILURE,
    PENDING,
    RUNNING,
    SUCCESS,
    WAITING,
)


def make_an_event(new_state: str) -> str:
    """Turn a new/target state into the name of the event that reaches it."""
    return f"on_{new_state}".lower()


def build_a_machine(freeze: bool = True) -> machines.FiniteMachine:
    """Build the state machine every request goes through."""
    m = machines.FiniteMachine()
    for state in (WAITING, PENDING, RUNNING):
        m.add_state(state)
    for state in (SUCCESS, FAILURE):
        m.add_state(state, terminal=True)
    # Created by the executor, not yet acknowledged by any worker.
    m.default_start_state = WAITING
    m.add_transition(WAITING, PENDING, make_an_event(PENDING))
    # Expired before any worker took it (or publishing it failed).
    m.add_transition(WAITING, FAILURE, make_an_event(FAILURE))
    # A worker started running it.
    m.add_transition(PENDING, RUNNING, make_an_event(RUNNING))
    # Expired while pending, or the worker could not even start it.
    m.add_transition(PENDING, FAILURE, make_an_event(FAILURE))
    # The task raised (or the reply could not be encoded).
    m.add_transition(RUNNING, FAILURE, make_an_event(FAILURE))
    m.add_transition(RUNNING, SUCCESS, make_an_event(SUCCESS))
    if freeze:
        m.freeze()
    return m


# Built once: requests move through a (state, event) -> state table read off
# the frozen machine instead of building a machine per request.
MACHINE = build_a_machine()
#: Where every request starts.
START_STATE: str = WAITING
TRANSITIONS: dict[tuple[str, str], str] = {(s, e): t for s, e, t in MACHINE}
