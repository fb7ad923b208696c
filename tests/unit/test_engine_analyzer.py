"""Incremental readiness counters of the analyzer."""

from __future__ import annotations

import array

import networkx as nx
import pytest

from flowengine import states as st
from flowengine.engines.action_engine import analyzer as an


def _allowed(name, old, new):
    return st.check_task_transition(old, new)


def _analyzer(edges, atoms, flows=()):
    graph = nx.DiGraph(edges)
    graph.add_nodes_from([*atoms, *flows])
    nodes = list(nx.topological_sort(graph))
    index = {n: i for i, n in enumerate(nodes)}
    # Successors by position, as the analyzer takes them (flat runs).
    flat, at = array.array("q"), array.array("q", [0])
    for n in nodes:
        flat.extend(index[v] for u, v in edges if u == n)
        at.append(len(flat))
    atom_ids = sorted(index[n] for n in atoms)
    a = an.Analyzer(nodes, (flat, at), atom_ids, _allowed, index)
    a.load((n, st.PENDING, st.EXECUTE) for n in atoms)
    return a


def _ready(a):
    return {n for n, _state in a.atom_states() if a.readiness(n) == an.EXECUTE}


def test_chain_becomes_ready_one_by_one():
    a = _analyzer([("x", "y"), ("y", "z")], ["x", "y", "z"])
    assert _ready(a) == {"x"}
    a.update("x", st.RUNNING)
    a.update("x", st.SUCCESS)
    assert _ready(a) == {"y"}


def test_flow_nodes_pass_status_through():
    # x, y -> flow end -> flow start -> z
    a = _analyzer(
        [("x", "end"), ("y", "end"), ("end", "start"), ("start", "z")],
        ["x", "y", "z"],
        flows=["end", "start"],
    )
    a.update("x", st.SUCCESS)
    assert "z" not in _ready(a)
    a.update("y", st.IGNORE, st.IGNORE)
    assert _ready(a) == {"z"}


def test_revert_waits_for_successors():
    a = _analyzer([("x", "y")], ["x", "y"])
    a.update("x", st.SUCCESS)
    a.update("y", st.FAILURE)
    a.update("x", intention=st.REVERT)
    a.update("y", intention=st.REVERT)
    assert a.readiness("x") is None
    assert a.readiness("y") == an.REVERT
    a.update("y", st.REVERTED)
    assert a.readiness("x") == an.REVERT


def test_ignored_atom_is_transparent_for_revert():
    # x -> y(ignored) -> z: z ran, so x reverts only after z did
    a = _analyzer([("x", "y"), ("y", "z")], ["x", "y", "z"])
    a.update("x", st.SUCCESS)
    a.update("y", st.IGNORE, st.IGNORE)
    a.update("z", st.FAILURE)
    a.update("x", intention=st.REVERT)
    a.update("z", intention=st.REVERT)
    assert a.readiness("x") is None
    a.update("z", st.REVERTED)
    assert a.readiness("x") == an.REVERT


def test_candidates_only_hold_changed_atoms():
    a = _analyzer([("x", "y"), ("y", "z")], ["x", "y", "z"])
    a.take_candidates()
    a.update("x", st.SUCCESS)
    assert set(a.take_candidates()) == {"x", "y"}


def test_first_candidates_after_load_are_every_atom_in_graph_order():
    # Given a freshly loaded analyzer (flow nodes between the atoms)
    a = _analyzer(
        [("x", "end"), ("y", "end"), ("end", "start"), ("start", "z")],
        ["x", "y", "z"],
        flows=["end", "start"],
    )
    # When an atom changes before the candidates are first taken
    a.update("y", st.RUNNING)
    # Then every atom comes back once, in the graph order
    first = a.take_candidates()
    assert first == [n for n in a._order if n in ("x", "y", "z")]
    assert a.take_candidates() == []


def test_changed_atoms_come_back_in_graph_order_whatever_order_they_changed_in():
    # Given unlinked atoms whose first candidates were taken
    a = _analyzer([], ["x", "y", "z"])
    a.take_candidates()
    last, first = [n for n in a._order if n != "y"][::-1]
    # When the last atom changes before the first
    a.update(last, st.RUNNING)
    a.update(first, st.RUNNING)
    # Then they are handed out first to last
    assert a.take_candidates() == [first, last]


def test_load_counts_from_stored_states():
    # x done and y running when loaded (a resumed run): z waits for y only
    graph = [("x", "y"), ("y", "z")]
    a = _analyzer(graph, ["x", "y", "z"])
    a.load(
        [
            ("x", st.SUCCESS, st.EXECUTE),
            ("y", st.RUNNING, st.EXECUTE),
            ("z", st.PENDING, st.EXECUTE),
        ]
    )
    assert _ready(a) == set()
    a.update("y", st.SUCCESS)
    assert _ready(a) == {"z"}
    a.update("z", st.FAILURE)
    a.update("z", intention=st.REVERT)
    a.update("y", intention=st.REVERT)
    assert a.readiness("y") is None
    a.update("z", st.REVERTED)
    assert a.readiness("y") == an.REVERT


def test_candidate_numbers_are_positions_in_the_order_and_give_the_same_readiness():
    # Given a chain x -> y whose first candidates were taken
    a = _analyzer([("x", "y")], ["x", "y"])
    a.take_candidates()
    # When y starts (x can no longer revert before it)
    a.update("y", st.RUNNING)
    numbers = a.take_candidate_numbers()
    # Then the numbers name x and y in graph order, each as ready as by name
    assert [a._order[i] for i in numbers] == ["x", "y"]
    assert [a.readiness_at(i, a._order[i]) for i in numbers] == [
        a.readiness("x"),
        a.readiness("y"),
    ]
    assert a.readiness("x") == an.EXECUTE


def test_states_and_intentions_read_by_name_from_the_lists_by_position():
    # Given a loaded chain x -> y between flow nodes (which have no state)
    a = _analyzer([("f", "x"), ("x", "y"), ("y", "f_end")], ["x", "y"], flows=["f", "f_end"])
    # When x runs and y is given another intention
    a.update("x", st.RUNNING)
    a.update("y", intention=st.REVERT)
    # Then each name reads its own state and intention, in graph order
    assert a.state_of("x") == st.RUNNING and a.intention_of("x") == st.EXECUTE
    assert a.state_of("y") == st.PENDING and a.intention_of("y") == st.REVERT
    assert list(a.atom_states()) == [("x", st.RUNNING), ("y", st.PENDING)]
    # And flow nodes and unknown names have none
    for name in ("f", "nobody"):
        with pytest.raises(KeyError):
            a.state_of(name)
        with pytest.raises(KeyError):
            a.intention_of(name)
    assert not a.is_success()
    a.update("x", st.SUCCESS)
    a.update("y", st.IGNORE)
    assert a.is_success() and not a.any_ready()
