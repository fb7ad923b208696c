"""The engine state machine: declared once, frozen, documented from code."""

from __future__ import annotations

import pytest
from automaton import exceptions as automaton_exc

from flowengine import states
from flowengine.engines.action_engine import builder


def test_transition_table_lists_every_transition():
    table = builder.transition_table()
    for event in (
        builder.START,
        builder.SCHEDULE,
        builder.WAIT,
        builder.ANALYZE,
        builder.FINISH,
        builder.SUCCESS,
        builder.REVERTED,
        builder.SUSPENDED,
        builder.FAILED,
    ):
        assert event in table
    for state in (
        states.RESUMING,
        states.SCHEDULING,
        states.WAITING,
        states.ANALYZING,
        states.SUCCESS,
        states.REVERTED,
        states.SUSPENDED,
        states.FAILURE,
    ):
        assert state in table


def test_built_machine_is_frozen():
    class _Runtime:
        completer = scheduler = None

    machine, _memory = builder.MachineBuilder(_Runtime(), lambda: True).build({})
    with pytest.raises(automaton_exc.FrozenMachine):
        machine.add_state("EXTRA")


def test_statistics_have_taskflows_keys_with_seconds_per_state():
    import flowengine.engines
    from flowengine import task as task_mod
    from flowengine.patterns import linear_flow

    class One(task_mod.Task):
        def execute(self):
            return 1

    engine = flowengine.engines.load(linear_flow.Flow("f").add(One("a"), One("b")))
    engine.run()
    stats = engine.statistics
    assert {
        "active_for",
        "awaiting",
        "completed",
        "discarded_failures",
        "incomplete",
        "seconds_per_state",
    } <= set(stats)
    assert set(stats["seconds_per_state"]) == {"analyzing", "resuming", "scheduling", "waiting"}
    assert all(s >= 0 for s in stats["seconds_per_state"].values())
    assert stats["completed"] == 2
