"""Link deciders: vetoing atoms (IGNORE) with each depth."""

from __future__ import annotations

from flowengine import deciders, states
from flowengine.patterns import graph_flow as gf
from flowengine.patterns import linear_flow as lf
from tests.engines import tasks
from tests.engines.observe import Recorder


def _allow_if_big(history):
    return next(iter(history.values())) > 5


def _flow(value, depth=None):
    flow = gf.Flow("decide")
    source = tasks.constant(value, name="source", provides="x")
    gated = tasks.Noop("gated")
    after = tasks.Noop("after")
    nested = lf.Flow("nested").add(tasks.Noop("nested-task"))
    flow.add(source, gated, after, nested)
    flow.link(source, gated, decider=_allow_if_big, decider_depth=depth)
    flow.link(gated, after)
    flow.link(after, nested)
    return flow


def test_decider_allows(make_engine):
    engine = make_engine(_flow(10))
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.SUCCESS) == ["source", "gated", "after", "nested-task"]
    assert rec.order(states.IGNORE) == []


def test_decider_depth_all_ignores_successors(make_engine):
    engine = make_engine(_flow(1))
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.IGNORE) == ["gated", "after", "nested-task"]
    assert engine.storage.get_atom_state("after") == states.IGNORE
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_decider_depth_atom_ignores_only_that_atom(make_engine):
    engine = make_engine(_flow(1, deciders.Depth.ATOM))
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.IGNORE) == ["gated"]
    assert rec.order(states.SUCCESS) == ["source", "after", "nested-task"]


def test_decider_depth_flow_stays_in_flow(make_engine):
    engine = make_engine(_flow(1, deciders.Depth.FLOW))
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.IGNORE) == ["gated", "after"]
    assert rec.order(states.SUCCESS) == ["source", "nested-task"]


def test_decider_depth_neighbors(make_engine):
    engine = make_engine(_flow(1, "NEIGHBORS"))
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.IGNORE) == ["gated", "after"]
    assert "nested-task" in rec.order(states.SUCCESS)


def test_decider_history_holds_source_results(make_engine):
    seen = {}

    def record(history):
        seen.update(history)
        return True

    flow = gf.Flow("hist")
    a = tasks.constant(3, name="a", provides="x")
    b = tasks.Noop("b")
    flow.add(a, b)
    flow.link(a, b, decider=record)
    make_engine(flow).run()
    assert seen == {"a": 3}


def test_decider_on_link_from_a_flow(make_engine):
    seen = {}

    def veto(history):
        seen.update(history)
        return False

    first = lf.Flow("first").add(
        tasks.constant(1, name="one", provides="x"), tasks.constant(2, name="two", provides="y")
    )
    last = tasks.Noop("last")
    flow = gf.Flow("from-flow").add(first, last)
    flow.link(first, last, decider=veto)
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.IGNORE) == ["last"]
    assert seen == {"one": 1, "two": 2}


def test_ignored_atoms_run_again_after_reset(make_engine):
    engine = make_engine(_flow(1))
    engine.run()
    engine.reset()
    assert engine.storage.get_atom_state("gated") == states.PENDING


def test_decider_on_links_from_two_atoms_into_a_nested_flow(make_engine):
    histories = []

    def should_go(history):
        histories.append(dict(history))
        return False

    task1, task2 = tasks.Noop("task1"), tasks.Noop("task2")
    subflow = lf.Flow("more-work").add(
        lf.Flow("more-more-work").add(tasks.Noop("task3"), tasks.Noop("task4"))
    )
    flow = gf.Flow("main-work").add(task1, task2, subflow)
    flow.link(task1, task2)
    flow.link(task2, subflow, decider=should_go)
    flow.link(task1, subflow, decider=should_go)
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.atoms == [
        ("task1", states.RUNNING),
        ("task1", states.SUCCESS),
        ("task2", states.RUNNING),
        ("task2", states.SUCCESS),
        ("task3", states.IGNORE),
        ("task4", states.IGNORE),
    ]
    # Asked once per link, as TaskFlow does (both links carry the same decider).
    assert histories == [{"task1": None, "task2": None}] * 2


def test_diamond_with_one_nay_ignores_the_join(make_engine):
    flow = gf.Flow("diamond")
    t1, t2, t3, t4 = (tasks.Noop(f"task{i}") for i in range(1, 5))
    flow.add(t1, t2, t3, t4)
    flow.link(t1, t2)
    flow.link(t2, t4, decider=lambda history: False)
    flow.link(t1, t3)
    flow.link(t3, t4, decider=lambda history: True)
    engine = make_engine(flow)
    engine.run()
    assert engine.storage.get_atom_state("task4") == states.IGNORE
    assert engine.storage.get_atom_intention("task4") == states.IGNORE
    assert engine.storage.get_atom_state("task3") == states.SUCCESS
