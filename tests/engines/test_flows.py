"""Running flows: patterns, data passing, results, notifications, run_iter."""

from __future__ import annotations

import pytest

from flowengine import states
from flowengine.patterns import graph_flow as gf
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from tests.engines import tasks
from tests.engines.observe import Recorder


def test_linear_flow_runs_in_order(make_engine):
    # Given a linear flow of three tasks
    flow = lf.Flow("lin").add(tasks.Noop("a"), tasks.Noop("b"), tasks.Noop("c"))
    engine = make_engine(flow)
    rec = Recorder(engine)
    # When it runs
    engine.run()
    # Then each ran once, in order, and the flow succeeded
    assert rec.order(states.RUNNING) == ["a", "b", "c"]
    assert rec.order(states.SUCCESS) == ["a", "b", "c"]
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_unordered_flow_runs_everything(make_engine):
    flow = uf.Flow("un").add(*[tasks.constant(i, name=f"t{i}", provides=f"v{i}") for i in range(5)])
    engine = make_engine(flow)
    engine.run()
    assert engine.storage.fetch_all() == {f"v{i}": i for i in range(5)}


def test_graph_flow_orders_by_data(make_engine):
    # Given a graph flow whose tasks were added in reverse dependency order
    flow = gf.Flow("g").add(
        tasks.Multiplier("double", provides="result"),
        tasks.Adder("add", provides="z"),
    )
    engine = make_engine(flow, store={"x": 2, "y": 3})
    rec = Recorder(engine)
    engine.run()
    # Then the provider ran first and the consumer saw its result
    assert rec.order(states.RUNNING) == ["add", "double"]
    assert engine.storage.fetch("result") == 10


def test_nested_flows(make_engine):
    inner = uf.Flow("inner").add(
        tasks.constant(1, name="one", provides="x"), tasks.constant(2, name="two", provides="y")
    )
    flow = lf.Flow("outer").add(
        inner,
        tasks.Adder("sum", provides="total"),
        gf.Flow("tail").add(tasks.Multiplier("times", rebind={"z": "total"}, provides="final")),
    )
    engine = make_engine(flow)
    engine.run()
    assert engine.storage.fetch("total") == 3
    assert engine.storage.fetch("final") == 6


def test_rebind_inject_and_multiple_provides(make_engine):
    flow = lf.Flow("data").add(
        tasks.pair(2, name="pair", provides=("first", "second")),
        tasks.Adder("add", rebind={"x": "first", "y": "second"}, provides="sum"),
        tasks.Multiplier("mul", rebind=["sum"], inject={"factor": 10}, provides="product"),
        tasks.Adder("from-store", rebind={"x": "a", "y": "b"}, provides="ab"),
    )
    engine = make_engine(flow, store={"a": "x", "b": "y"})
    engine.run()
    assert engine.storage.fetch("first") == 0
    assert engine.storage.fetch("second") == 1
    assert engine.storage.fetch("product") == 10
    assert engine.storage.fetch("ab") == "xy"
    assert engine.storage.get("pair") == [0, 1]


def test_single_task_as_flow(make_engine):
    engine = make_engine(tasks.Adder("just-me", provides="z"), store={"x": 1, "y": 1})
    engine.run()
    assert engine.storage.fetch("z") == 2


def test_rerun_of_finished_flow_runs_nothing(make_engine):
    flow = lf.Flow("again").add(tasks.Noop("a"))
    engine = make_engine(flow)
    engine.run()
    rec = Recorder(engine)
    engine.run()
    assert rec.atoms == []
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_notifications_sequence_and_details(make_engine):
    flow = lf.Flow("notified").add(tasks.constant(7, name="a", provides="x"), tasks.Noop("b"))
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.flow == [states.RUNNING, states.SUCCESS]
    assert rec.atoms == [
        ("a", states.RUNNING),
        ("a", states.SUCCESS),
        ("b", states.RUNNING),
        ("b", states.SUCCESS),
    ]
    running, success = rec.details[0][1], rec.details[1][1]
    assert running["task_name"] == "a"
    assert running["task_uuid"] == engine.storage.get_atom_uuid("a")
    assert running["old_state"] == states.PENDING
    assert "result" not in running
    assert success["old_state"] == states.RUNNING
    assert success["result"] == 7


def test_flow_notification_details(make_engine):
    flow = lf.Flow("flow-details").add(tasks.Noop("a"))
    engine = make_engine(flow)
    seen = []
    engine.notifier.register(states.SUCCESS, lambda state, details: seen.append(details))
    engine.run()
    (details,) = seen
    assert details["flow_name"] == "flow-details"
    assert details["flow_uuid"] == engine.storage.flow_uuid
    assert details["old_state"] == states.RUNNING


def test_run_iter_yields_engine_states(make_engine):
    flow = lf.Flow("iter").add(tasks.Noop("a"), tasks.Noop("b"))
    engine = make_engine(flow)
    seen = list(engine.run_iter())
    assert seen == [
        states.RESUMING,
        states.SCHEDULING,
        states.WAITING,
        states.ANALYZING,
        states.SCHEDULING,
        states.WAITING,
        states.ANALYZING,
        states.SUCCESS,
    ]


def test_empty_flow_succeeds(make_engine):
    engine = make_engine(lf.Flow("empty"))
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_statistics_recorded(make_engine):
    engine = make_engine(lf.Flow("stats").add(tasks.Noop("a")))
    engine.run()
    assert engine.statistics["active_for"] >= 0
    assert engine.statistics["completed"] == 1


def test_compilation_property(make_engine):
    engine = make_engine(lf.Flow("comp").add(tasks.Noop("a")))
    assert engine.compilation is None
    engine.compile()
    assert "a" in engine.compilation.atoms


@pytest.mark.parametrize("count", [1, 30])
def test_wide_graph_fan_in(make_engine, count):
    # Many independent producers feeding one consumer through a subflow end.
    producers = uf.Flow("producers").add(
        *[tasks.constant(i, name=f"p{i}", provides=f"v{i}") for i in range(count)]
    )
    flow = lf.Flow("fan").add(producers, tasks.constant("end", name="last", provides="z"))
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.RUNNING)[-1] == "last"
    assert len(rec.order(states.SUCCESS)) == count + 1


def test_priority_orders_ready_tasks(engine_kind, make_engine):
    if engine_kind != "serial":
        pytest.skip("start order is only observable when tasks run one at a time")
    flow = uf.Flow("prio")
    for i in range(10):
        t = tasks.Noop(f"task{i}")
        t.priority = i
        flow.add(t)
    engine = make_engine(flow)
    rec = Recorder(engine)
    engine.run()
    assert rec.order(states.RUNNING) == [f"task{i}" for i in reversed(range(10))]


@pytest.mark.parametrize(
    "flow_factory",
    [
        lambda: lf.Flow("l"),
        lambda: uf.Flow("u"),
        lambda: gf.Flow("g"),
        lambda: gf.Flow("g").add(lf.Flow("l-1"), gf.Flow("g-2")),
    ],
)
def test_run_iter_of_empty_flows(make_engine, flow_factory):
    engine = make_engine(flow_factory())
    assert list(engine.run_iter()) == [
        states.RESUMING,
        states.SCHEDULING,
        states.WAITING,
        states.ANALYZING,
        states.SUCCESS,
    ]


def test_not_a_flow_raises_type_error_naming_it(make_engine):
    value = "i am string, not task/flow, sorry"
    with pytest.raises(TypeError, match=value):
        make_engine(value).run()


def test_resume_uses_results_already_in_the_flow_detail(make_engine):
    # Given a flow detail in which task1 already succeeded with 17
    from flowengine.persistence import helpers as p_utils
    from flowengine.persistence import models
    from flowengine.persistence.backends import impl_memory

    backend = impl_memory.MemoryBackend()
    _book, flow_detail = p_utils.temporary_flow_detail(backend)
    detail = models.TaskDetail(name="task1", uuid="42")
    detail.state = states.SUCCESS
    detail.results = 17
    flow_detail.add(detail)
    flow = lf.Flow("resumed").add(
        tasks.constant(1, name="task1", provides="x1"),
        tasks.constant(5, name="task2", provides="x2"),
    )
    engine = make_engine(flow, flow_detail=flow_detail, backend=backend)
    rec = Recorder(engine)
    engine.run()
    assert rec.atoms == [("task2", states.RUNNING), ("task2", states.SUCCESS)]
    assert engine.storage.fetch_all() == {"x1": 17, "x2": 5}


def test_storage_lookups_by_atom_see_its_scope(make_engine):
    flow = lf.Flow("scoped").add(
        tasks.AddOneSame("a", rebind={"value": "source"}),
        tasks.AddOneSame("b"),
        tasks.AddOneSame("c"),
    )
    engine = make_engine(flow, store={"source": 0})
    engine.run()
    rebind = {"value": "value"}
    assert engine.storage.fetch_mapped_args({"value": "source"}, atom_name="a") == {"value": 0}
    assert engine.storage.fetch_mapped_args(rebind, atom_name="b") == {"value": 1}
    assert engine.storage.fetch_mapped_args(rebind, atom_name="c") == {"value": 2}
