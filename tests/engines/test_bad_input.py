"""Bad flows fail early with errors that name the culprit."""

from __future__ import annotations

import pytest

from flowengine import exceptions as exc
from flowengine.patterns import graph_flow as gf
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from tests.engines import tasks


def test_missing_requirement_names_atom_and_symbol(make_engine):
    flow = lf.Flow("needy").add(tasks.Noop("ok"), tasks.Adder("adder"))
    engine = make_engine(flow, store={"x": 1})
    engine.compile()
    engine.prepare()
    with pytest.raises(exc.MissingDependencies) as raised:
        engine.validate()
    text = str(raised.value)
    assert "adder" in text and "'y'" in text
    assert raised.value.missing_requirements == ["y"]


def test_missing_requirement_also_stops_run(make_engine):
    engine = make_engine(lf.Flow("needy").add(tasks.Multiplier("mul", rebind={"z": "zz"})))
    with pytest.raises(exc.MissingDependencies, match="zz"):
        engine.run()


def test_missing_requirement_of_single_task(make_engine):
    engine = make_engine(tasks.Adder("lonely"))
    with pytest.raises(exc.MissingDependencies) as raised:
        engine.run()
    assert "lonely" in str(raised.value)
    assert sorted(raised.value.missing_requirements) == ["x", "y"]


def test_unordered_members_cannot_feed_each_other(make_engine):
    flow = uf.Flow("un").add(
        tasks.constant(1, name="maker", provides="x"), tasks.Adder("user", provides="z")
    )
    engine = make_engine(flow, store={"y": 1})
    with pytest.raises(exc.MissingDependencies, match="user"):
        engine.run()


def test_cycle_names_atoms():
    a = tasks.Adder("a", rebind={"x": "b_out", "y": "b_out"}, provides="a_out")
    b = tasks.Multiplier("b", rebind={"z": "a_out"}, provides="b_out")
    with pytest.raises(exc.DependencyFailure) as raised:
        gf.Flow("cyclic").add(a, b)
    assert "a" in str(raised.value) and "b" in str(raised.value)


def test_manual_cycle_names_atoms():
    flow = gf.Flow("cyclic").add(tasks.Noop("first"), tasks.Noop("second"))
    flow.link(_by_name(flow, "first"), _by_name(flow, "second"))
    with pytest.raises(exc.DependencyFailure) as raised:
        flow.link(_by_name(flow, "second"), _by_name(flow, "first"))
    assert "first" in str(raised.value) and "second" in str(raised.value)


def _by_name(flow, name):
    for item, _meta in flow.iter_nodes():
        if item.name == name:
            return item
    raise KeyError(name)


def test_duplicate_names(make_engine):
    with pytest.raises(exc.Duplicate) as raised:
        flow = lf.Flow("dups").add(tasks.Noop("same"), tasks.Noop("same"))
        make_engine(flow).compile()
    assert "same" in str(raised.value)


def test_duplicate_names_across_subflows(make_engine):
    flow = lf.Flow("dups").add(
        lf.Flow("one").add(tasks.Noop("twin")), lf.Flow("two").add(tasks.Noop("twin"))
    )
    with pytest.raises(exc.Duplicate, match="twin"):
        make_engine(flow).run()


def test_non_atom_item():
    thing = object()
    with pytest.raises(TypeError) as raised:
        lf.Flow("bad").add(thing)
    assert "object" in str(raised.value)


def test_task_returning_fewer_values_than_declared_is_stored_as_in_taskflow(make_engine):
    # Given a task that provides three names but returns two values
    flow = lf.Flow("short").add(tasks.pair(2, name="short", provides=("a", "b", "c")))
    engine = make_engine(flow)
    # Then, as in TaskFlow, what it returned is stored and only 'c' is missing
    engine.run()
    assert engine.storage.fetch("a") == 0
    with pytest.raises(exc.NotFound, match="'c'"):
        engine.storage.fetch("c")


def test_strict_results_fails_a_task_returning_fewer_values(make_engine):
    # Given a task that provides three names but returns two values
    flow = lf.Flow("short").add(
        tasks.Noop("before"), tasks.pair(2, name="short", provides=("a", "b", "c"))
    )
    engine = make_engine(flow, strict_results=True)
    # Then that task fails with ResultMismatch naming it, and the flow reverts
    with pytest.raises(exc.ResultMismatch) as raised:
        engine.run()
    assert "short" in str(raised.value) and "'c'" in str(raised.value)
    assert engine.storage.get_atom_state("before") == "REVERTED"
    assert engine.storage.get_atom_state("short") == "REVERTED"


def test_unknown_engine_name():
    from flowengine import engines

    with pytest.raises(exc.NotFound, match="no-such-engine"):
        engines.load(lf.Flow("f"), engine="no-such-engine")


def test_bad_executor_option():
    from flowengine import engines

    with pytest.raises(ValueError, match="nonsense"):
        engines.load(lf.Flow("f"), engine="parallel", executor="nonsense")
    with pytest.raises(TypeError):
        engines.load(lf.Flow("f"), engine="parallel", executor=object())


def test_ambiguous_providers_name_symbol_and_providers(make_engine):
    both = uf.Flow("both").add(
        tasks.constant(1, name="p1", provides="z"), tasks.constant(2, name="p2", provides="z")
    )
    flow = lf.Flow("ambiguous").add(both, tasks.Multiplier("consumer"))
    with pytest.raises(exc.AmbiguousDependency) as raised:
        make_engine(flow).run()
    text = str(raised.value)
    assert "'z'" in text and "p1" in text and "p2" in text and "consumer" in text


def test_ambiguity_settled_by_a_stored_value(make_engine):
    both = uf.Flow("both").add(
        tasks.constant(1, name="p1", provides="z"), tasks.constant(2, name="p2", provides="z")
    )
    flow = lf.Flow("ambiguous").add(both, tasks.Multiplier("consumer", provides="out"))
    engine = make_engine(flow, store={"z": 21})
    engine.run()
    assert engine.storage.fetch("out") == 42
