"""Retry controllers: Times, ForEach, ParameterizedForEach, AlwaysRevert(All), nesting."""

from __future__ import annotations

from flowengine import retry, states
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from tests.engines import tasks
from tests.engines.observe import Recorder, raises_failure


def test_times_retries_until_success(make_engine):
    # Given a subflow that fails on its first two attempts
    flow = lf.Flow("times", retry.Times(3, name="r", provides="attempt")).add(
        tasks.Noop("before"), tasks.fail_until(3, name="flaky")
    )
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    # Then it ran three times, reverting the subflow between attempts
    assert rec.count("flaky", states.RUNNING) == 3
    assert rec.count("before", states.REVERTED) == 2
    assert rec.count("r", states.RETRYING) == 2
    assert engine.storage.fetch("outcome") == "ok on 3"
    history = engine.storage.get_retry_history("r")
    assert len(history) == 3
    assert [sorted(failures) for _, failures in history] == [["flaky"], ["flaky"], []]
    assert history.caused_by(RuntimeError)


def test_retry_state_sequence(make_engine):
    flow = lf.Flow("seq", retry.Times(2, name="r", provides="attempt")).add(
        tasks.fail_until(2, name="flaky")
    )
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.states_of("r") == [
        states.RUNNING,
        states.SUCCESS,
        states.RETRYING,
        states.RUNNING,
        states.SUCCESS,
    ]
    assert rec.states_of("flaky") == [
        states.RUNNING,
        states.FAILURE,
        states.REVERTING,
        states.REVERTED,
        states.PENDING,
        states.RUNNING,
        states.SUCCESS,
    ]
    retry_details = [d for s, d in rec.details if d.get("retry_name") == "r"]
    assert retry_details[1]["result"] == 1
    assert retry_details[0]["retry_uuid"] == engine.storage.get_atom_uuid("r")


def test_times_exhausted_reverts_only_its_subflow(make_engine):
    # Given a task before a subflow whose retry gives up (REVERT, no parent retry)
    sub = lf.Flow("sub", retry.Times(2, name="r", provides="attempt")).add(
        tasks.fail_until(99, name="flaky")
    )
    flow = lf.Flow("outer").add(tasks.Noop("first"), sub)
    engine = make_engine(flow)
    rec = Recorder(engine)
    with raises_failure(RuntimeError, match="failed on attempt 2"):
        engine.run()
    # Then the subflow was reverted but the task before it was not (TaskFlow semantics)
    assert rec.count("flaky", states.RUNNING) == 2
    assert rec.states_of("first") == [states.RUNNING, states.SUCCESS]
    assert rec.states_of("r")[-1] == states.REVERTED
    assert engine.storage.get_flow_state() == states.REVERTED


def test_defer_reverts_reverts_outer_work(make_engine):
    sub = lf.Flow("sub", retry.Times(2, name="r", provides="attempt")).add(
        tasks.fail_until(99, name="flaky")
    )
    flow = lf.Flow("outer").add(tasks.Noop("first"), sub)
    engine = make_engine(flow, defer_reverts=True)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    assert rec.states_of("first")[-1] == states.REVERTED


def test_times_revert_all(make_engine):
    sub = lf.Flow("sub", retry.Times(1, name="r", provides="attempt", revert_all=True)).add(
        tasks.fail_until(99, name="flaky")
    )
    flow = lf.Flow("outer").add(tasks.Noop("first"), sub)
    engine = make_engine(flow)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    assert rec.states_of("first")[-1] == states.REVERTED


def test_for_each_tries_each_value(make_engine):
    flow = lf.Flow("each", retry.ForEach([1, 2, 3], name="r", provides="attempt")).add(
        tasks.fail_until(3, name="flaky")
    )
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.count("flaky", states.RUNNING) == 3
    assert engine.storage.fetch("attempt") == 3


def test_for_each_runs_out_of_values(make_engine):
    flow = lf.Flow("each", retry.ForEach([1, 2], name="r", provides="attempt")).add(
        tasks.fail_until(3, name="flaky")
    )
    engine = make_engine(flow)
    with raises_failure(RuntimeError):
        engine.run()
    assert engine.storage.get_flow_state() == states.REVERTED


def test_parameterized_for_each_takes_values_from_store(make_engine):
    flow = lf.Flow("pfe", retry.ParameterizedForEach(name="r", provides="attempt")).add(
        tasks.fail_until("c", name="flaky")
    )
    engine = make_engine(flow, store={"values": ["a", "b", "c"]})
    rec = Recorder(engine)
    engine.run()
    assert rec.count("flaky", states.RUNNING) == 3
    assert engine.storage.fetch("outcome") == "ok on c"


def test_always_revert_reverts_its_subflow_only(make_engine):
    sub = lf.Flow("sub", retry.AlwaysRevert("r")).add(tasks.Noop("inside"), tasks.Fail("boom"))
    flow = lf.Flow("outer").add(tasks.Noop("first"), sub)
    engine = make_engine(flow)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    assert rec.order(states.REVERTED) == ["boom", "inside", "r"]
    assert rec.states_of("first") == [states.RUNNING, states.SUCCESS]


def test_always_revert_all_reverts_everything(make_engine):
    sub = lf.Flow("sub", retry.AlwaysRevertAll("r")).add(tasks.Noop("inside"), tasks.Fail("boom"))
    flow = lf.Flow("outer").add(tasks.Noop("first"), sub)
    engine = make_engine(flow)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    assert rec.order(states.REVERTED) == ["boom", "inside", "r", "first"]


def test_nested_retries_outer_retries_when_inner_gives_up(make_engine):
    # Given an inner retry (2 attempts) inside an outer retry (2 attempts)
    inner = lf.Flow("inner", retry.Times(2, name="r-inner", provides="attempt")).add(
        tasks.fail_until(99, name="flaky")
    )
    outer = lf.Flow("outer", retry.Times(2, name="r-outer", provides="outer_attempt")).add(
        tasks.Noop("outer-task"), inner
    )
    engine = make_engine(outer)
    rec = Recorder(engine)
    with raises_failure(RuntimeError):
        engine.run()
    # Then the inner subflow ran 2 x 2 times: the outer retried once
    assert rec.count("flaky", states.RUNNING) == 4
    assert rec.count("r-outer", states.RETRYING) == 1
    assert rec.count("outer-task", states.RUNNING) == 2
    assert engine.storage.get_flow_state() == states.REVERTED


def test_nested_retry_inner_recovers(make_engine):
    inner = lf.Flow("inner", retry.Times(3, name="r-inner", provides="attempt")).add(
        tasks.fail_until(2, name="flaky")
    )
    outer = lf.Flow("outer", retry.Times(2, name="r-outer", provides="outer_attempt")).add(
        tasks.Noop("outer-task"), inner
    )
    engine = make_engine(outer)
    rec = Recorder(engine)
    engine.run()
    assert rec.count("flaky", states.RUNNING) == 2
    assert rec.count("outer-task", states.RUNNING) == 1
    assert rec.count("r-outer", states.RETRYING) == 0


def test_retry_with_parallel_branches(make_engine):
    flow = uf.Flow("branches", retry.Times(2, name="r", provides="attempt")).add(
        tasks.Noop("side"), tasks.fail_until(2, name="flaky")
    )
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.count("flaky", states.SUCCESS) == 1
    assert rec.states_of("side")[-1] == states.SUCCESS
