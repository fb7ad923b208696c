"""Flow patterns: linear, unordered, graph (and targeted graph) flows."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from flowengine import deciders, retry, task
from flowengine import exceptions as exc
from flowengine.flow import LINK_DECIDER, LINK_DECIDER_DEPTH, LINK_MANUAL, LINK_REASONS
from flowengine.patterns import graph_flow as gf
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from flowengine.patterns._dag import CycleError, OrderedDAG


class _T(task.Task):
    def execute(self, **kwargs):
        return None


def _task(name, provides=None, requires=None):
    return _T(name=name, provides=provides, requires=requires)


def _retry(name=None, provides=None, requires=None):
    r = retry.AlwaysRevert(name=name or "unnamed", provides=provides, requires=requires)
    if name is None:
        # TaskFlow leaves an unnamed retry's name None for the flow to fill in.
        r.name = None
    return r


# -- common behaviour ------------------------------------------------------


@pytest.mark.parametrize(
    "cls, label",
    [(lf.Flow, "linear_flow.Flow"), (uf.Flow, "unordered_flow.Flow"), (gf.Flow, "graph_flow.Flow")],
)
def test_str_and_empty(cls, label):
    f = cls("test")
    assert str(f) == f'"{label}: test(len=0)"'
    assert len(f) == 0 and list(f) == [] and list(f.iter_links()) == []
    assert f.requires == set() and f.provides == set()
    assert f.add() is f
    f.add(_task("a"), _task("b"), _task("c"))
    assert str(f) == f'"{label}: test(len=3)"'


@pytest.mark.parametrize("cls", [lf.Flow, uf.Flow, gf.Flow])
def test_rejects_non_atoms_naming_them(cls):
    f = cls("test")
    with pytest.raises(TypeError, match="not 4"):
        f.add(_task("a"), 4)
    assert len(f) == 0  # nothing half-added
    with pytest.raises(TypeError, match="object"):
        f.add(object())


@pytest.mark.parametrize("cls", [lf.Flow, uf.Flow, gf.Flow])
def test_flow_can_not_contain_itself(cls):
    f = cls("test")
    with pytest.raises(ValueError, match="itself"):
        f.add(f)


@pytest.mark.parametrize("cls", [lf.Flow, uf.Flow, gf.Flow])
def test_same_item_twice_is_ignored(cls):
    a = _task("a")
    f = cls("test").add(a, a)
    f.add(a)
    assert list(f) == [a]


@pytest.mark.parametrize("cls", [lf.Flow, uf.Flow, gf.Flow])
def test_unnamed_retry_takes_flow_name(cls):
    r = _retry(requires=["a"], provides=["b"])
    f = cls("test", r)
    assert f.retry is r
    assert r.name == "test_retry"
    assert f.requires == {"a"}
    assert f.provides == {"b"}


@pytest.mark.parametrize("cls", [lf.Flow, uf.Flow, gf.Flow])
def test_named_retry_keeps_its_name(cls):
    r = _retry(name="mine")
    cls("test", r)
    assert r.name == "mine"


@pytest.mark.parametrize("cls", [lf.Flow, uf.Flow, gf.Flow])
def test_retry_provides_satisfy_children(cls):
    f = cls("test", _retry(provides=["a", "b"]))
    f.add(_task("t", requires=["a"]))
    assert f.requires == set()
    assert f.provides == {"a", "b"}


@pytest.mark.parametrize("cls", [lf.Flow, uf.Flow, gf.Flow])
def test_iter_nodes_metadata_is_empty(cls):
    tasks = [_task("a"), _task("b")]
    f = cls("test").add(*tasks)
    for node, meta in f.iter_nodes():
        assert node in tasks
        assert meta == {}


# -- linear ----------------------------------------------------------------


def test_linear_links_in_insertion_order():
    t1, t2, t3 = _task("t1"), _task("t2"), _task("t3")
    f = lf.Flow("test").add(t1, t2).add(t3)
    assert list(f) == [t1, t2, t3]
    assert list(f.iter_links()) == [(t1, t2, {"invariant": True}), (t2, t3, {"invariant": True})]


def test_linear_requires_only_unsatisfied():
    f = lf.Flow("test").add(
        _task("a", requires=["x"], provides=["b", "c"]), _task("b", requires=["b"], provides=["d"])
    )
    assert f.requires == {"x"}
    assert f.provides == {"b", "c", "d"}


def test_linear_requires_earlier_consumer_is_not_satisfied_by_later_provider():
    f = lf.Flow("test").add(_task("a", requires=["x"]), _task("b", provides=["x"]))
    assert f.requires == {"x"}


def test_nested_flow_requires_and_provides():
    inner = lf.Flow("inner").add(_task("a", requires=["x"], provides=["y"]))
    outer = lf.Flow("outer").add(_task("p", provides=["x"]), inner, _task("c", requires=["y", "z"]))
    assert inner.requires == {"x"}
    assert outer.requires == {"z"}
    assert outer.provides == {"x", "y"}


# -- unordered -------------------------------------------------------------


def test_unordered_children_do_not_satisfy_each_other():
    f = uf.Flow("test").add(_task("b", requires=["a"])).add(_task("a", provides=["a"]))
    assert len(f) == 2
    assert f.requires == {"a"}
    assert f.provides == {"a"}
    assert list(f.iter_links()) == []


# -- graph -----------------------------------------------------------------


def test_graph_infers_links_from_symbols():
    t1 = _task("t1", provides=["a", "b"])
    t2 = _task("t2", provides=["c"], requires=["a", "b"])
    t3 = _task("t3", requires=["c"])
    f = gf.Flow("test").add(t3, t2, t1)
    links = {(u.name, v.name): meta for u, v, meta in f.iter_links()}
    assert links == {("t1", "t2"): {LINK_REASONS: {"a", "b"}}, ("t2", "t3"): {LINK_REASONS: {"c"}}}
    assert [n.name for n in f] == ["t1", "t2", "t3"]
    assert f.requires == set()


def test_graph_links_across_add_calls():
    t1, t2 = _task("t1", provides=["a"]), _task("t2", requires=["a"])
    f = gf.Flow("test").add(t1).add(t2)
    assert list(f.iter_links()) == [(t1, t2, {LINK_REASONS: {"a"}})]
    g = gf.Flow("test").add(t2).add(t1)
    assert list(g.iter_links()) == [(t1, t2, {LINK_REASONS: {"a"}})]


def test_graph_ambiguous_provider_raises_and_keeps_flow():
    f = gf.Flow("test").add(_task("t1", provides=["a", "b"]), _task("t2", provides=["a"]))
    assert f.provides == {"a", "b"}
    with pytest.raises(exc.AmbiguousDependency, match=r"t3.*\['t1', 't2'\].*'a'"):
        f.add(_task("t3", requires=["a"]))
    assert len(f) == 2


def test_graph_resolve_flags():
    t1 = _task("t1", provides=["a", "b", "c"])
    t2 = _task("t2", requires=["a", "b"])
    f = gf.Flow("test").add(t1, t2, resolve_requires=False)
    assert f.requires == {"a", "b"}

    r1, r2 = _task("r1", requires=["a", "b"]), _task("r2", provides=["a", "b"])
    f = gf.Flow("test").add(r1)
    f.add(r2, resolve_existing=False)
    assert f.requires == {"a", "b"}
    f = gf.Flow("test").add(_task("r1", requires=["a", "b"]))
    f.add(_task("r2", provides=["a", "b"]), resolve_existing=True)
    assert f.requires == set()


def test_graph_requirement_satisfied_through_an_ancestor_is_not_relinked():
    a = _task("a", provides=["x"])
    b = _task("b")
    c = _task("c", requires=["x"])
    f = gf.Flow("test").add(a, b)
    f.add(c, resolve_requires=False)
    f.link(a, b).link(b, c)
    assert f.requires == set()
    f.add(_task("d", provides=["y"]))
    assert not f.graph.has_edge(a, c)


def test_graph_manual_links_and_metadata():
    t1, t2 = _task("t1", provides=["a"]), _task("t2", requires=["a"])
    f = gf.Flow("test").add(t1, t2)
    assert f.link(t1, t2) is f
    assert list(f.iter_links()) == [(t1, t2, {LINK_MANUAL: True, LINK_REASONS: {"a"}})]


def test_graph_link_unknown_nodes():
    t1, t2 = _task("t1"), _task("t2")
    f = gf.Flow("test").add(t2)
    with pytest.raises(ValueError, match="not found to link from"):
        f.link(t1, t2)
    f = gf.Flow("test").add(t1)
    with pytest.raises(ValueError, match="not found to link to"):
        f.link(t1, t2)


def test_graph_link_cycle_names_atoms_and_keeps_flow():
    t1, t2, t3 = _task("t1"), _task("t2"), _task("t3")
    f = gf.Flow("test").add(t1, t2, t3)
    f.link(t1, t2).link(t2, t3)
    with pytest.raises(exc.DependencyFailure, match="t3 -> t1 -> t2 -> t3"):
        f.link(t3, t1)
    assert len(list(f.iter_links())) == 2
    with pytest.raises(exc.DependencyFailure):
        f.link(t1, t1)


def test_graph_dependency_cycle_on_add_is_discarded():
    t1 = _task("t1", provides=["a"], requires=["c"])
    t2 = _task("t2", provides=["b"], requires=["a"])
    t3 = _task("t3", provides=["c"], requires=["b"])
    f = gf.Flow("test").add(t1, t2)
    with pytest.raises(exc.DependencyFailure, match="t1.*t2.*t3|t3.*t1.*t2"):
        f.add(t3)
    assert list(f) == [t1, t2]
    assert [(u.name, v.name) for u, v, _ in f.iter_links()] == [("t1", "t2")]
    assert f.requires == {"c"}


def test_graph_deciders():
    t1, t2 = _task("t1"), _task("t2")

    def decide(history):
        return True

    f = gf.Flow("g").add(t1, t2)
    f.link(t1, t2, decider=decide)
    assert list(f.iter_links())[0][2] == {LINK_MANUAL: True, LINK_DECIDER: decide}
    f.link(t1, t2, decider=decide, decider_depth="atom")
    assert list(f.iter_links())[0][2][LINK_DECIDER_DEPTH] is deciders.Depth.ATOM
    # A new decider without a depth drops the old depth.
    f.link(t1, t2, decider=decide)
    assert LINK_DECIDER_DEPTH not in list(f.iter_links())[0][2]


@pytest.mark.parametrize("bad", ["not-a-depth", object(), 2, 3.4, False])
def test_graph_invalid_decider_depth(bad):
    t1, t2 = _task("t1"), _task("t2")
    f = gf.Flow("g").add(t1, t2)
    with pytest.raises((ValueError, TypeError)):
        f.link(t1, t2, decider=lambda history: False, decider_depth=bad)
    assert list(f.iter_links()) == []


def test_graph_decider_checks():
    t1, t2 = _task("t1"), _task("t2")
    f = gf.Flow("g").add(t1, t2)
    with pytest.raises(ValueError, match="callable"):
        f.link(t1, t2, decider="nope")
    with pytest.raises(ValueError, match="requires a decider"):
        f.link(t1, t2, decider_depth="ALL")


def test_graph_unlink():
    t1, t2 = _task("t1"), _task("t2")
    f = gf.Flow("g").add(t1, t2).link(t1, t2)
    assert f.unlink(t1, t2) is f
    assert list(f.iter_links()) == []
    with pytest.raises(ValueError):
        f.unlink(t1, t2)
    f.link(t2, t1)  # the reverse is fine once unlinked


def test_graph_subflows_are_nodes():
    t3 = _task("t3", provides=["c"])
    sub = gf.Flow("nested").add(t3)
    t1 = _task("t1", provides=["a"], requires=["c"])
    f = gf.Flow("test").add(t1, sub)
    assert list(f) == [sub, t1]
    assert [(u, v) for u, v, _ in f.iter_links()] == [(sub, t1)]


def test_graph_iteration_is_topological():
    rnd = random.Random(7)
    tasks = [
        _task(f"t{i}", provides=[f"v{i}"], requires=[f"v{rnd.randrange(i)}"] if i else [])
        for i in range(60)
    ]
    rnd.shuffle(tasks)
    f = gf.Flow("g")
    for t in tasks:
        f.add(t)
    position = {n: i for i, n in enumerate(f)}
    for u, v, _ in f.iter_links():
        assert position[u] < position[v]
    assert f.requires == set()


def _by_position(f):
    """What the compiler makes of iter_nodes and iter_links_beyond_reasons."""
    items = [item for item, _meta in f.iter_nodes()]
    where = {id(item): pos for pos, item in enumerate(items)}
    return items, [(where[id(u)], where[id(v)], m) for u, v, m in f.iter_links_beyond_reasons()]


def _numbered(f):
    items, links = f._numbered_links()
    return items, list(links)


def test_graph_numbered_links_are_the_links_by_position():
    # Given a graph flow whose items were added out of order and reordered
    # by later links, with manual links carrying metadata
    rnd = random.Random(3)
    ts = [_task(f"t{i}", provides=f"s{i}") for i in range(12)]
    shuffled = ts[:]
    rnd.shuffle(shuffled)
    f = gf.Flow("g").add(*shuffled)
    for i in range(12):
        for j in rnd.sample(range(i), min(i, 2)):
            f.link(ts[j], ts[i], decider=(lambda history: True) if i % 4 == 0 else None)
    sub = lf.Flow("sub").add(_task("x", requires=["s3"]))
    f.add(sub)
    # Then its numbered links are its links by position in iter_nodes' order
    assert _numbered(f) == _by_position(f)
    assert len(_numbered(f)[1]) == len(list(f.iter_links()))


def test_targeted_numbered_links_follow_the_target():
    f, (t1, t2, t3, t4) = _targeted()
    f.set_target(t3)
    assert _numbered(f) == _by_position(f)
    assert _numbered(f)[0] == [t1, t2, t3]
    f.reset_target()
    assert _numbered(f) == _by_position(f)


def test_patterns_without_numbers_leave_it_to_the_compiler():
    class Listed(gf.Flow):
        def iter_nodes(self):
            return reversed(list(super().iter_nodes()))

    assert Listed("l").add(_task("a"))._numbered_links() is None
    assert lf.Flow("l").add(_task("a"))._numbered_links() is None
    assert uf.Flow("u").add(_task("a"))._numbered_links() is None


# -- targeted --------------------------------------------------------------


def _targeted():
    f = gf.TargetedFlow("test")
    ts = [
        _task("t1", provides=["a"]),
        _task("t2", provides=["b"], requires=["a"]),
        _task("t3", requires=["b"]),
        _task("t4", provides=["c"], requires=["b"]),
    ]
    f.add(*ts)
    return f, ts


def test_targeted_restricts_and_resets():
    f, (t1, t2, t3, t4) = _targeted()
    f.set_target(t3)
    assert len(f) == 3
    assert set(f) == {t1, t2, t3}
    assert "c" not in f.provides
    f.reset_target()
    assert len(f) == 4 and "c" in f.provides


def test_targeted_bad_target():
    f = gf.TargetedFlow("test").add(_task("t1"))
    with pytest.raises(ValueError, match="^Node .* not found"):
        f.set_target(_task("t2"))


def test_targeted_recaches_on_add_and_link():
    f = gf.TargetedFlow("test")
    t1 = _task("t1", requires=["a"])
    f.add(t1)
    f.set_target(t1)
    assert len(f) == 1
    f.add(_task("t2", provides=["a"]))
    assert len(f) == 2
    t3 = _task("t3")
    f.add(t3)
    assert len(f) == 2
    f.link(t3, t1)
    assert len(f) == 3


# -- the incremental DAG -----------------------------------------------------


def test_ordered_dag_matches_networkx_on_random_edges():
    rnd = random.Random(3)
    dag, ref = OrderedDAG(), nx.DiGraph()
    for n in range(40):
        dag.add_node(n)
        ref.add_node(n)
    for _ in range(400):
        u, v = rnd.randrange(40), rnd.randrange(40)
        ref.add_edge(u, v)
        acyclic = nx.is_directed_acyclic_graph(ref)
        try:
            dag.add_edge(u, v)
        except CycleError as err:
            assert not acyclic
            ref.remove_edge(u, v)
            cycle = err.cycle
            assert cycle[0] == cycle[-1]
            assert all(ref.has_edge(a, b) or (a, b) == (u, v) for a, b in zip(cycle, cycle[1:]))
        else:
            assert acyclic
        order = {n: i for i, n in enumerate(dag.topological())}
        assert all(order[a] < order[b] for a, b, _ in dag.edges())
    assert dag.number_of_edges() == ref.number_of_edges()


def test_links_beyond_reasons_leave_out_reason_only_metadata():
    t1, t2, t3 = _task("t1", provides="a"), _task("t2", requires=["a"]), _task("t3")
    f = gf.Flow("f").add(t1, t2, t3)
    f.link(t2, t3)
    assert list(f.iter_links_beyond_reasons()) == [(t1, t2, None), (t2, t3, {LINK_MANUAL: True})]
    # iter_links still gives every link its metadata.
    assert list(f.iter_links()) == [(t1, t2, {LINK_REASONS: {"a"}}), (t2, t3, {LINK_MANUAL: True})]
    # Patterns that do not store links compactly give what iter_links gives.
    lin = lf.Flow("l").add(_task("x"), _task("y"))
    assert list(lin.iter_links_beyond_reasons()) == list(lin.iter_links())
