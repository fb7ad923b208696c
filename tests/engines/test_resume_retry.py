"""Resuming flows with retry controllers from every point a crash may leave them."""

from __future__ import annotations

import pytest

from flowengine import retry, states
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from flowengine.types import failure
from tests.engines import tasks
from tests.engines.observe import Recorder

CRASH_POINTS = ["task fails", "retry queried", "retry updated", "task updated", "revert scheduled"]


def _crashed_engine(make_engine, when):
    # Replays, step by step, what an engine writes to storage when a task
    # under a retry fails, stopping at `when` as if the process died there.
    flow = uf.Flow("flow-1", retry.Times(3, provides="x")).add(tasks.Noop("task1"))
    engine = make_engine(flow)
    engine.compile()
    engine.prepare()
    storage = engine.storage
    storage.set_flow_state(states.RUNNING)
    storage.save("flow-1_retry", 1)
    fail = failure.Failure.from_exception(RuntimeError("foo"))
    storage.save("task1", fail, state=states.FAILURE)
    steps = [
        ("retry queried", lambda: storage.save_retry_failure("flow-1_retry", "task1", fail)),
        ("retry updated", lambda: storage.set_atom_intention("flow-1_retry", states.RETRY)),
        ("task updated", lambda: storage.set_atom_intention("task1", states.REVERT)),
        ("revert scheduled", lambda: storage.set_atom_state("task1", states.REVERTING)),
    ]
    for name, step in steps:
        if when == "task fails":
            break
        step()
        if name == when:
            break
    return engine


@pytest.mark.parametrize("when", CRASH_POINTS)
def test_resume_after_crash_while_resolving_a_failure(make_engine, when):
    engine = _crashed_engine(make_engine, when)
    rec = Recorder(engine)
    engine.run()
    assert rec.states_of("task1")[-4:] == [
        states.REVERTED,
        states.PENDING,
        states.RUNNING,
        states.SUCCESS,
    ]
    assert rec.count("task1", states.REVERTED) == 1
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_resume_flow_interrupted_while_retrying(make_engine):
    flow = lf.Flow("flow-1", retry.Times(3, "r1")).add(
        tasks.Noop("t1"), tasks.Noop("t2"), tasks.Noop("t3")
    )
    engine = make_engine(flow)
    engine.compile()
    engine.prepare()
    engine.storage.set_atom_state("r1", states.RETRYING)
    engine.storage.set_atom_state("t2", states.REVERTED)
    engine.storage.set_atom_state("t3", states.REVERTED)
    rec = Recorder(engine)
    engine.run()
    assert rec.atoms == [
        ("t2", states.PENDING),
        ("t3", states.PENDING),
        ("r1", states.RUNNING),
        ("r1", states.SUCCESS),
        ("t1", states.RUNNING),
        ("t1", states.SUCCESS),
        ("t2", states.RUNNING),
        ("t2", states.SUCCESS),
        ("t3", states.RUNNING),
        ("t3", states.SUCCESS),
    ]


def test_resume_flow_that_should_be_retried(make_engine):
    flow = lf.Flow("flow-1", retry.Times(3, "r1")).add(tasks.Noop("t1"), tasks.Noop("t2"))
    engine = make_engine(flow)
    engine.compile()
    engine.prepare()
    engine.storage.set_atom_intention("r1", states.RETRY)
    engine.storage.set_atom_state("r1", states.SUCCESS)
    engine.storage.set_atom_state("t1", states.REVERTED)
    engine.storage.set_atom_state("t2", states.REVERTED)
    rec = Recorder(engine)
    engine.run()
    assert rec.atoms[:4] == [
        ("r1", states.RETRYING),
        ("t1", states.PENDING),
        ("t2", states.PENDING),
        ("r1", states.RUNNING),
    ]
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_failing_retry_is_reverted_with_its_failure(make_engine):
    flow = lf.Flow("retry-fails", retry.ForEach([], name="empty", provides="x")).add(
        tasks.Noop("never")
    )
    engine = make_engine(flow)
    rec = Recorder(engine)
    with pytest.raises(Exception, match="No elements left"):
        engine.run()
    assert rec.states_of("empty") == [
        states.RUNNING,
        states.FAILURE,
        states.REVERTING,
        states.REVERTED,
    ]
    assert rec.states_of("never") == []
