"""Reverting: order, arguments, failures while reverting, several failures."""

from __future__ import annotations

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.patterns import graph_flow as gf
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from tests.engines import tasks
from tests.engines.observe import Recorder, raises_failure


def test_failure_in_the_middle_reverts_completed_work_in_reverse(make_engine):
    # Given a -> b -> boom -> never
    flow = lf.Flow("rev").add(
        tasks.Noop("a"), tasks.Noop("b"), tasks.Fail("boom"), tasks.Noop("never")
    )
    engine = make_engine(flow)
    rec = Recorder(engine)
    # When it runs, the original exception surfaces
    with raises_failure(RuntimeError, match="Woot from boom"):
        engine.run()
    # Then what ran is reverted newest first (the failed task too), the rest never ran
    assert rec.order(states.REVERTED) == ["boom", "b", "a"]
    assert rec.states_of("never") == []
    assert rec.states_of("boom") == [
        states.RUNNING,
        states.FAILURE,
        states.REVERTING,
        states.REVERTED,
    ]
    assert engine.storage.get_flow_state() == states.REVERTED
    assert rec.flow[-1] == states.REVERTED


def test_graph_revert_follows_dependencies(make_engine):
    flow = gf.Flow("g").add(
        tasks.constant(1, name="root", provides="x"),
        tasks.Adder("left", rebind={"y": "x"}, provides="l"),
        tasks.Multiplier("right", rebind={"z": "x"}, provides="r"),
        tasks.Fail("sink", requires=("l", "r")),
    )
    engine = make_engine(flow)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    reverted = rec.order(states.REVERTED)
    assert reverted[0] == "sink" and reverted[-1] == "root"
    assert set(reverted) == {"sink", "left", "right", "root"}


def test_revert_receives_result_and_flow_failures(make_engine):
    flow = lf.Flow("args").add(tasks.RevertReporter("reporter"), tasks.Fail("boom"))
    engine = make_engine(flow)
    with raises_failure(RuntimeError):
        engine.run()
    reported = engine.storage.get_revert_result("reporter")
    assert reported == {"result": "done", "flow_failures": ["boom"]}


def test_failed_task_revert_gets_its_failure(make_engine):
    flow = lf.Flow("own").add(tasks.RevertReporter("first"), tasks.FailingReporter("failing"))
    engine = make_engine(flow)
    with raises_failure(RuntimeError):
        engine.run()
    reported = engine.storage.get_revert_result("failing")
    assert reported["result"] == "failure: Woot from failing"


def test_revert_failure_ends_in_failure(make_engine):
    flow = lf.Flow("bad-revert").add(tasks.FailOnRevert("fragile"), tasks.Fail("boom"))
    engine = make_engine(flow)
    rec = Recorder(engine)
    # The revert failure stops the engine and is what surfaces (as TaskFlow)
    with raises_failure(RuntimeError, match="Revert woot from fragile"):
        engine.run()
    assert states.REVERT_FAILURE in rec.states_of("fragile")
    assert engine.storage.get_flow_state() == states.FAILURE


def test_several_failures_raise_wrapped_failure(make_engine):
    flow = uf.Flow("many").add(tasks.Fail("f1"), tasks.Fail("f2"))
    engine = make_engine(flow)
    with pytest.raises(exc.WrappedFailure) as raised:
        engine.run()
    messages = sorted(f.exception_str for f in raised.value)
    assert messages == ["Woot from f1", "Woot from f2"]
    assert "WrappedFailure" in str(raised.value)


def test_reverted_flow_runs_again_from_scratch(make_engine):
    flow = lf.Flow("twice").add(tasks.Noop("a"), tasks.Fail("boom"))
    engine = make_engine(flow)
    with raises_failure(RuntimeError):
        engine.run()
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    # The second run reset every atom and ran them again
    assert rec.states_of("a")[:3] == [states.PENDING, states.RUNNING, states.SUCCESS]
    assert rec.count("boom", states.FAILURE) == 1


def test_never_resolve_stops_without_reverting(make_engine):
    flow = lf.Flow("no-resolve").add(tasks.Noop("a"), tasks.Fail("boom"))
    engine = make_engine(flow, never_resolve=True)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    assert rec.order(states.REVERTED) == []
    assert engine.storage.get_flow_state() == states.FAILURE


def test_revert_removes_results(make_engine):
    flow = lf.Flow("revert-removes").add(
        tasks.constant(1, name="one", provides="one"),
        tasks.pair(3, name="multi", provides=("a", "b", "c")),
        tasks.Fail("fail"),
    )
    engine = make_engine(flow)
    with raises_failure(RuntimeError):
        engine.run()
    assert engine.storage.fetch_all() == {}


def test_task_not_run_is_not_reverted(make_engine):
    flow = lf.Flow("not-run").add(tasks.Fail("fail"), tasks.Noop("never"))
    engine = make_engine(flow)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    assert rec.atoms == [
        ("fail", states.RUNNING),
        ("fail", states.FAILURE),
        ("fail", states.REVERTING),
        ("fail", states.REVERTED),
    ]
