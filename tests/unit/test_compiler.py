"""PatternCompiler: execution graph shape, errors and provider scoping."""

from __future__ import annotations

import random
import time

import networkx as nx
import pytest

from flowengine import deciders, flow, retry, task
from flowengine import exceptions as exc
from flowengine.engines.action_engine import compiler
from flowengine.patterns import graph_flow as gf
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf


class _T(task.Task):
    def execute(self, **kwargs):
        return None


class _Optional(task.Task):
    def execute(self, a, b=2):
        return a + b


def _task(name, provides=None, requires=None, **kwargs):
    return _T(name=name, provides=provides, requires=requires, **kwargs)


def _compile(item):
    return compiler.PatternCompiler(item).compile()


def _edges(c):
    return sorted(c.execution_graph.edges())


# -- graph shape -------------------------------------------------------------


def test_single_task_is_wrapped():
    t = _task("a")
    c = _compile(t)
    assert c.root is t
    assert c.topological_order == ("a",)
    assert c.kind("a") == compiler.TASK
    root = c.root_node
    assert c.kind(root) == compiler.FLOW
    assert _edges(c) == sorted([(root, "a"), ("a", c.flow_end_of(root))])


def test_unknown_root():
    with pytest.raises(TypeError, match="Unknown object"):
        compiler.PatternCompiler(object()).compile()


def test_linear_shape_and_attrs():
    f = lf.Flow("f").add(_task("a"), _task("b"), _task("c"))
    c = _compile(f)
    g = c.execution_graph
    start, end = c.root_node, c.flow_end_of(c.root_node)
    assert start == "f[0]" and end == "f[0][end]"
    assert _edges(c) == sorted([(start, "a"), ("a", "b"), ("b", "c"), ("c", end)])
    assert g.nodes["a"]["atom"] is list(f)[0]
    assert g.nodes[start]["flow"] is f and g.nodes[end]["kind"] == compiler.FLOW_END
    for _u, _v, data in g.edges(data=True):
        assert data == {"invariant": True, "decider": None, "decider_depth": None}
    assert c.topological_order == ("a", "b", "c")
    assert [t.name for t in c.tasks()] == ["a", "b", "c"]
    assert list(c.retries()) == []
    assert nx.is_frozen(g)
    assert not nx.is_frozen(compiler.PatternCompiler(f, freeze=False).compile().execution_graph)


def test_subflows_link_through_their_ends():
    sub = lf.Flow("sub").add(_task("b"), _task("c"))
    f = lf.Flow("f").add(_task("a"), sub, _task("d"))
    c = _compile(f)
    s = c.parent_flow("b")
    assert s == "sub[1]"
    assert c.parent_flow(s) == "f[0]"
    assert c.parent_flow("f[0]") is None
    assert _edges(c) == sorted(
        [
            ("f[0]", "a"),
            ("a", "sub[1]"),
            ("sub[1]", "b"),
            ("b", "c"),
            ("c", "sub[1][end]"),
            ("sub[1][end]", "d"),
            ("d", "f[0][end]"),
        ]
    )
    assert c.flow_atoms("sub[1]") == ("b", "c")
    assert c.flow_atoms("f[0]") == ("a", "b", "c", "d")
    assert c.flow_nodes() == ("f[0]", "sub[1]")


def test_unordered_shape_and_empty_flow():
    f = uf.Flow("u").add(_task("a"), _task("b"), lf.Flow("empty"))
    c = _compile(f)
    assert _edges(c) == sorted(
        [
            ("u[0]", "a"),
            ("u[0]", "b"),
            ("u[0]", "empty[1]"),
            ("a", "u[0][end]"),
            ("b", "u[0][end]"),
            ("empty[1]", "empty[1][end]"),
            ("empty[1][end]", "u[0][end]"),
        ]
    )


def test_flow_node_names_avoid_atom_names():
    f = lf.Flow("f").add(_task("f[0]"))
    c = _compile(f)
    assert c.root_node == "f[1]"


def test_retry_placement_and_queries():
    inner_retry = retry.AlwaysRevert(name="r2")
    inner = lf.Flow("inner", inner_retry).add(_task("c"))
    outer = lf.Flow("outer", retry.Times(2, name="r1")).add(_task("a"), inner, _task("d"))
    f = lf.Flow("root").add(outer, _task("z"))
    c = _compile(f)
    g = c.execution_graph
    assert g.has_edge("outer[1]", "r1") and g.has_edge("r1", "a")
    assert g.has_edge("inner[2]", "r2") and g.has_edge("r2", "c")
    assert g.nodes["r1"]["kind"] == compiler.RETRY
    assert c.topological_order == ("r1", "a", "r2", "c", "d", "z")
    assert c.retry_of("a") == "r1" and c.retry_of("c") == "r2"
    assert c.retry_of("r2") == "r1" and c.retry_of("r1") is None
    assert c.retry_of("z") is None
    assert c.controlled_by("r1") == ("a", "r2", "c", "d")
    assert c.controlled_by("r2") == ("c",)
    assert c.parent_flow("r2") == "inner[2]"
    assert [r.name for r in c.retries()] == ["r1", "r2"]
    with pytest.raises(ValueError):
        c.controlled_by("a")
    assert nx.is_directed_acyclic_graph(g)
    assert list(nx.topological_sort(g))[0] == "root[0]"


def test_graph_links_keep_deciders():
    def decide(history):
        return True

    a, b, d = _task("a"), _task("b"), _task("d")
    sub = lf.Flow("sub").add(_task("c"))
    f = gf.Flow("g").add(a, b, sub, d)
    f.link(a, b, decider=decide)
    f.link(b, sub, decider=decide, decider_depth="flow")
    f.link(sub, d)
    c = _compile(f)
    g = c.execution_graph
    assert g.edges["a", "b"] == {
        "invariant": False,
        "decider": decide,
        "decider_depth": deciders.Depth.ALL,
    }
    assert g.edges["b", "sub[1]"]["decider_depth"] is deciders.Depth.FLOW
    assert g.edges["sub[1][end]", "d"] == {
        "invariant": False,
        "decider": None,
        "decider_depth": None,
    }
    assert _edges(c) == sorted(
        [
            ("g[0]", "a"),
            ("a", "b"),
            ("b", "sub[1]"),
            ("sub[1]", "c"),
            ("c", "sub[1][end]"),
            ("sub[1][end]", "d"),
            ("d", "g[0][end]"),
        ]
    )


# -- errors -----------------------------------------------------------------


def test_duplicate_names_are_listed():
    f = lf.Flow("f").add(_task("a"), _task("b"), lf.Flow("s").add(_task("a"), _task("b")))
    with pytest.raises(exc.Duplicate, match=r"\['a', 'b'\]"):
        _compile(f)


def test_same_atom_in_two_flows():
    t = _task("a")
    f = uf.Flow("f").add(lf.Flow("x").add(t), lf.Flow("y").add(t))
    with pytest.raises(exc.Duplicate, match="'a'"):
        _compile(f)


def test_retry_name_clashing_with_task():
    f = lf.Flow("f", retry.AlwaysRevert(name="a")).add(_task("a"))
    with pytest.raises(exc.Duplicate):
        _compile(f)


def test_recursive_flow():
    f1, f2 = lf.Flow("f1"), lf.Flow("f2")
    f1.add(f2)
    f2.add(f1)
    with pytest.raises(ValueError, match="f1|f2"):
        _compile(f1)


class _Custom(flow.Flow):
    """A minimal user-written pattern (no add-time checks)."""

    def __init__(self, name, items, links=()):
        super().__init__(name)
        self._items = list(items)
        self._links = list(links)

    def add(self, *items):
        self._items.extend(items)
        return self

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def iter_nodes(self):
        return ((i, {}) for i in self._items)

    def iter_links(self):
        return ((u, v, {}) for u, v in self._links)

    @property
    def requires(self):
        return frozenset()


def test_non_atom_items_name_the_object():
    with pytest.raises(TypeError, match="Unknown object 4 .*'c'"):
        _compile(_Custom("c", [_task("a"), 4]))
    with pytest.raises(TypeError, match="retry="):
        _compile(_Custom("c", [retry.AlwaysRevert(name="r")]))
    f = lf.Flow("f", retry=_task("fake"))
    with pytest.raises(TypeError, match="not a Retry"):
        _compile(f)


def test_custom_flow_cycle_names_atoms():
    a, b, d = _task("a"), _task("b"), _task("d")
    f = _Custom("c", [d, a, b], links=[(a, b), (b, a)])
    with pytest.raises(exc.DependencyFailure, match="a -> b -> a|b -> a -> b"):
        _compile(f)


def test_custom_flow_out_of_order_items_are_sorted():
    a, b = _task("a", provides="x"), _task("b", requires="x")
    c = _compile(_Custom("c", [b, a], links=[(a, b)]))
    assert c.topological_order == ("a", "b")
    assert c.providers("b", "x") == ("a",)


def test_custom_flow_linking_unknown_item():
    with pytest.raises(exc.CompilationFailure):
        _compile(_Custom("c", [_task("a")], links=[(_task("zz"), _task("a"))]))


def test_compile_is_cached():
    pc = compiler.PatternCompiler(lf.Flow("f").add(_task("a")))
    assert pc.compile() is pc.compile()


# -- scoping -----------------------------------------------------------------


def test_linear_latest_provider_first():
    f = lf.Flow("root").add(
        _task("customer", provides="dog"),
        _task("customer2", provides="dog"),
        _task("washer", requires="dog"),
    )
    c = _compile(f)
    assert c.providers("washer", "dog") == ("customer2", "customer")
    assert c.ambiguities() == ()
    assert c.providers("customer", "dog") == ()


def test_atom_never_provides_to_itself():
    f = lf.Flow("root").add(*[_task(f"t{i}", provides="x", requires="x") for i in range(3)])
    c = _compile(f)
    assert c.providers("t0", "x") == ()
    assert c.providers("t2", "x") == ("t1", "t0")
    assert c.unresolved("t0") == {"x"}


def test_nested_levels_nearest_first():
    sub = lf.Flow("sub").add(_task("s1", provides="x"), _task("s2", requires="x"))
    f = lf.Flow("root").add(
        _task("r1", provides="x"), _task("r2", provides="x"), sub, _task("r3", requires="x")
    )
    c = _compile(f)
    assert c.providers("s2", "x") == ("s1", "r2", "r1")
    # After the subflow, its providers are the latest ones.
    assert c.providers("r3", "x") == ("s1", "r2", "r1")


def test_outer_scope_is_seen_inside_subflows():
    sub = uf.Flow("sub").add(_task("s1", requires="x"), _task("s2", requires="x"))
    f = lf.Flow("root").add(_task("r1", provides="x"), sub)
    c = _compile(f)
    assert c.providers("s1", "x") == ("r1",)
    assert c.providers("s2", "x") == ("r1",)


def test_unordered_siblings_do_not_see_each_other():
    f = uf.Flow("u").add(_task("a", provides="x"), _task("b", requires="x"))
    c = _compile(f)
    assert c.providers("b", "x") == ()
    assert c.unresolved("b") == {"x"}
    # revert(**kwargs) takes the same requirements as execute (TaskFlow's rule).
    assert list(c.iter_unresolved()) == [
        ("b", "execute", frozenset({"x"})),
        ("b", "revert", frozenset({"x"})),
    ]


def test_graph_scope_only_ancestors():
    customer = _task("customer", provides="dog")
    washer = _task("washer", requires="dog", provides="wash")
    dryer = _task("dryer", requires=["dog", "wash"], provides="dry_dog")
    other = _task("other", provides="zzz")
    f = gf.Flow("g").add(customer, washer, dryer, other)
    c = _compile(f)
    assert c.providers("dryer", "dog") == ("customer",)
    assert c.providers("dryer", "wash") == ("washer",)
    assert c.unresolved("dryer") == frozenset()


def test_graph_ambiguous_providers():
    customer = _task("customer", provides="dog")
    customer2 = _task("customer2", provides="dog")
    washer = _task("washer", requires="dog")
    f = gf.Flow("g").add(customer, washer)
    f.add(customer2, resolve_requires=False)
    f.link(customer2, washer)
    c = _compile(f)
    (amb,) = c.ambiguities()
    assert amb.atom == "washer" and amb.symbol == "dog"
    assert sorted(amb.providers) == ["customer", "customer2"]
    with pytest.raises(exc.AmbiguousDependency, match="washer.*dog.*customer"):
        c.providers("washer", "dog")
    # The plan still lists both (the engine decides what to do).
    (spec,) = c.argument_plan("washer")
    assert set(spec.providers) == {"customer", "customer2"}


def test_graph_ordered_providers_are_not_ambiguous():
    customer = _task("customer", provides="dog")
    customer2 = _task("customer2", provides="dog")
    washer = _task("washer", requires="dog")
    f = gf.Flow("g").add(customer, washer)
    f.add(customer2, resolve_requires=False)
    f.link(customer2, washer).link(customer, customer2)
    c = _compile(f)
    assert c.ambiguities() == ()
    assert c.providers("washer", "dog") == ("customer2", "customer")


def test_graph_indirect_ancestor_resolves_ambiguity():
    a, b, m = _task("a", provides="x"), _task("b", provides="x"), _task("m")
    w = _task("w", requires="x")
    f = gf.Flow("g").add(a, b, m, w, resolve_requires=False, resolve_existing=False)
    f.link(a, m).link(m, b).link(b, w).link(a, w)
    c = _compile(f)
    assert c.providers("w", "x") == ("b", "a")


def test_unordered_subflow_providers_are_ambiguous_afterwards():
    u = uf.Flow("u").add(_task("a", provides="x"), _task("b", provides="x"))
    f = lf.Flow("root").add(_task("first", provides="x"), u, _task("c", requires="x"))
    c = _compile(f)
    (amb,) = c.ambiguities()
    assert (amb.atom, amb.symbol, sorted(amb.providers)) == ("c", "x", ["a", "b"])
    assert "first" in c.argument_plan("c")[0].providers


def test_nearer_level_hides_outer_ambiguity():
    u = uf.Flow("u").add(_task("a", provides="x"), _task("b", provides="x"))
    sub = lf.Flow("sub").add(_task("near", provides="x"), _task("c", requires="x"))
    c = _compile(lf.Flow("root").add(u, sub))
    assert c.ambiguities() == ()
    assert c.providers("c", "x")[0] == "near"


def test_retry_provides_to_its_flow_and_is_farthest():
    r = retry.ForEach([1, 2], name="r", provides="x")
    inner = lf.Flow("inner", r).add(
        _task("a", requires="x"), _task("b", provides="x"), _task("c", requires="x")
    )
    c = _compile(lf.Flow("root").add(_task("outer", provides="x"), inner))
    assert c.providers("a", "x") == ("r", "outer")
    assert c.providers("c", "x") == ("b", "r", "outer")
    assert c.ambiguities() == ()


def test_retry_sees_only_outer_scope():
    r = retry.ParameterizedForEach(name="r", provides="x", rebind=["vals"])
    inner = lf.Flow("inner", r).add(_task("v", provides="vals"))
    c = _compile(lf.Flow("root").add(_task("outer", provides="vals"), inner))
    assert c.providers("r", "vals") == ("outer",)


def test_optional_and_injected_arguments():
    t = _Optional(name="t")
    c = _compile(lf.Flow("f").add(t))
    assert c.unresolved("t") == {"a"}
    plan = c.argument_plan("t")
    assert [(s.name, s.symbol, s.optional) for s in plan] == [("a", "a", False), ("b", "b", True)]
    t2 = _Optional(name="t2", inject={"a": 5})
    c = _compile(lf.Flow("f").add(t2))
    assert c.unresolved("t2") == frozenset()


def test_injected_symbol_is_not_ambiguous():
    u = uf.Flow("u").add(_task("a", provides="x"), _task("b", provides="x"))
    f = lf.Flow("root").add(u, _task("c", requires="x", inject={"x": 1}))
    assert _compile(f).ambiguities() == ()


def test_rebind_uses_symbols():
    t = _T(name="t", rebind={"arg": "sym"}, requires=["arg"])
    f = lf.Flow("f").add(_task("p", provides="sym"), t)
    c = _compile(f)
    (spec,) = c.argument_plan("t")
    assert (spec.name, spec.symbol, spec.providers) == ("arg", "sym", ("p",))
    assert c.revert_argument_plan("t")[0].providers == ("p",)
    assert c.revert_providers("t", "sym") == ("p",)
    assert c.providers("t", "unrelated") == ()


class _RevertNeedsMore(task.Task):
    def execute(self, x):
        return x

    def revert(self, x, y, *args, **kwargs):
        return None


def test_symbols_only_revert_consumes_get_providers():
    # Given a task whose revert takes a symbol its execute does not,
    t = _RevertNeedsMore(name="t")
    f = lf.Flow("root").add(_task("p", provides="x"), _task("q", provides="y"), t)
    # when it is compiled,
    c = _compile(f)
    # then that symbol has its provider too, and needs no outside value.
    assert [(s.symbol, s.providers) for s in c.revert_argument_plan("t")] == [
        ("x", ("p",)),
        ("y", ("q",)),
    ]
    assert c.revert_providers("t", "y") == ("q",)
    assert c.unresolved("t", "revert") == frozenset()
    assert c.needing_outside_values() == ()
    # And an ambiguity in what only revert consumes is found as well.
    u = uf.Flow("u").add(_task("a", provides="y"), _task("b", provides="y"))
    c = _compile(lf.Flow("root2").add(_task("p", provides="x"), u, _RevertNeedsMore(name="t")))
    assert [(a.atom, a.symbol) for a in c.ambiguities()] == [("t", "y")]


def test_item_with_many_predecessors():
    # Given a graph flow whose last task needs more symbols than the
    # compiler gathers in a tuple (past that, a list),
    count = compiler._PREDS_COPIED + 4
    feeders = [_task(f"p{i}", provides=f"v{i}") for i in range(count)]
    sink = _task("sink", requires=[f"v{i}" for i in range(count)])
    # when it is compiled,
    c = _compile(gf.Flow("g").add(sink, *feeders))
    # then every feeder runs before it and provides its symbol.
    assert c.topological_order[-1] == "sink"
    assert set(c.execution_graph.predecessors("sink")) == {f"p{i}" for i in range(count)}
    assert all(c.providers("sink", f"v{i}") == (f"p{i}",) for i in range(count))
    assert c.scope_for("sink") == (tuple(f"p{i}" for i in reversed(range(count))),)


def test_random_graph_scopes_match_ancestors():
    rnd = random.Random(11)
    tasks = []
    for i in range(120):
        reqs = sorted({f"v{rnd.randrange(i)}" for _ in range(rnd.randint(0, 3))}) if i else []
        tasks.append(_task(f"t{i}", provides=f"v{i}", requires=reqs))
    rnd.shuffle(tasks)
    c = _compile(gf.Flow("g").add(*tasks))
    g = c.execution_graph
    for t in tasks:
        ancestors = nx.ancestors(g, t.name)
        for symbol in t.requires:
            (provider,) = c.providers(t.name, symbol)
            assert provider in ancestors and provider == "t" + symbol[1:]
    assert c.ambiguities() == ()


def test_topology_numbers_agree_with_the_networkx_graph():
    # Given a pattern with nested flows of every kind, retries (nested too)
    # and links with deciders, built out of order
    def decide(history):
        return True

    rnd = random.Random(5)
    inner = uf.Flow("inner", retry=retry.Times(2, name="r2")).add(_task("u1"), _task("u2"))
    graph_tasks = [_task(f"g{i}", provides=f"s{i}") for i in range(8)]
    g = gf.Flow("graph").add(*graph_tasks, inner)
    for i in range(8):
        for j in rnd.sample(range(i), min(i, 2)):
            g.link(graph_tasks[j], graph_tasks[i], decider=decide if (i + j) % 3 == 0 else None)
    g.link(graph_tasks[2], inner)
    root = lf.Flow("root", retry=retry.Times(3, name="r1")).add(
        _task("first"), g, lf.Flow("empty"), _task("last")
    )
    # When it is compiled
    c = _compile(root)
    topology, nxg = c.topology, c.execution_graph
    # Then every node keeps the networkx graph's number (insertion order),
    # kind, neighbours (in edge order) and reach, and the topological
    # order is networkx's
    assert topology.order == list(nxg.nodes)
    for number, node in enumerate(topology.order):
        assert topology.index[node] == number
        assert topology.kinds[node] == nxg.nodes[node]["kind"]
        assert topology.preds_of(node) == tuple(nxg.predecessors(node))
        assert topology.succs_of(node) == tuple(nxg.successors(node))
        assert topology.descendants(node) == nx.descendants(nxg, node)
        assert topology.ancestors(node) == nx.ancestors(nxg, node)
    assert topology.topological() == list(nx.topological_sort(nxg))
    assert {(u, v) for u, v, d in nxg.edges(data=True) if d["decider"]} == set(topology.deciders)
    assert all(n >= topology.first_atom for n in map(topology.index.get, c.atoms))


# -- speed (printed, not asserted: wall clock varies too much) ----------------


def _random_graph_flow(n, seed):
    rnd = random.Random(seed)
    tasks = []
    for i in range(n):
        reqs = sorted({f"v{rnd.randrange(i)}" for _ in range(rnd.randint(0, 3))}) if i else []
        tasks.append(_task(f"t{i}", provides=f"v{i}", requires=reqs))
    rnd.shuffle(tasks)
    return gf.Flow("g").add(*tasks)


def test_compile_timings(capsys):
    flows = {
        "graph flow, 2000 tasks, random deps": _random_graph_flow(2000, 42),
        "linear flow, 1000 tasks": lf.Flow("l").add(
            *[
                _task(f"t{i}", provides=f"v{i}", requires=[f"v{i - 1}"] if i else [])
                for i in range(1000)
            ]
        ),
        "linear flow, 1000 tasks, one shared symbol": lf.Flow("s").add(
            *[_task(f"t{i}", provides="x", requires=["x"] if i else []) for i in range(1000)]
        ),
    }
    with capsys.disabled():
        print()
        for label, f in flows.items():
            started = time.perf_counter()
            c = compiler.PatternCompiler(f).compile()
            elapsed = time.perf_counter() - started
            assert len(c.topological_order) == len(f)
            print(f"  compile {label}: {elapsed * 1000:.1f} ms")


# -- scope levels (what storage walks for arbitrary lookups) -----------------


def test_scope_levels_linear_nested():
    r1, r2, r3 = _task("root.1"), _task("root.2"), _task("root.3")
    sub = lf.Flow("subroot").add(_task("subroot.1"), _task("subroot.2"))
    end = _task("root.4")
    c = _compile(lf.Flow("root").add(r1, r2, r3, sub, end))
    assert c.scope_for("root.1") == ()
    assert c.scope_for("root.3") == (("root.2", "root.1"),)
    assert c.scope_for("subroot.1") == ((), ("root.3", "root.2", "root.1"))
    assert c.scope_for("root.4") == (("subroot.2", "subroot.1", "root.3", "root.2", "root.1"),)


def test_scope_levels_graph_and_mixed():
    r = gf.Flow("root")
    r1, r2 = _task("root.1"), _task("root.2")
    r.add(r1, r2).link(r1, r2)
    s = lf.Flow("subroot").add(_task("subroot.1"), _task("subroot.2"))
    t1, t2 = _task("subroot2.1"), _task("subroot2.2")
    t = gf.Flow("subroot2").add(t1, t2).link(t1, t2)
    r.add(s, t).link(s, t)
    c = _compile(r)
    assert c.scope_for("root.1") == ()
    assert c.scope_for("root.2") == (("root.1",),)
    assert c.scope_for("subroot.1") == ()
    assert c.scope_for("subroot2.1") == ((), ("subroot.2", "subroot.1"))
    assert c.scope_for("subroot2.2") == (("subroot2.1",), ("subroot.2", "subroot.1"))


def test_scope_levels_unordered_and_retry():
    atoms = [_task(f"u.{i}") for i in range(3)]
    u = uf.Flow("u", retry.AlwaysRevert(name="r")).add(*atoms)
    c = _compile(lf.Flow("root").add(_task("root.1"), u, _task("root.2")))
    for a in atoms:
        assert c.scope_for(a.name) == (("r",), ("root.1",))
    assert c.scope_for("r") == (("root.1",),)
    (level,) = c.scope_for("root.2")
    assert set(level[:3]) == {"u.0", "u.1", "u.2"}
    assert level[3:] == ("r", "root.1")
