"""The TaskFlow-named helper types: graph, tree, timing, entity, logging, version."""

from __future__ import annotations

import logging
import threading

import networkx as nx
import pytest

import flowengine
from flowengine import logging as fe_logging
from flowengine import version
from flowengine.types import entity, graph, timing, tree


def _species() -> tree.Node:
    animal, mammal, primate = tree.Node("animal"), tree.Node("mammal"), tree.Node("primate")
    animal.add(mammal)
    animal.add(tree.Node("reptile"))
    mammal.add(tree.Node("horse"))
    mammal.add(primate)
    primate.add(tree.Node("monkey"))
    return animal


def test_graph_freezes_and_exports_dot():
    g = graph.OrderedDiGraph(name="my flow")
    g.add_edge("a", "b", label="x y")
    assert g.export_to_dot() == 'strict digraph "my flow" {\na;\nb;\na -> b [label="x y"];\n}\n'
    assert list(g.no_predecessors_iter()) == ["a"] and list(g.no_successors_iter()) == ["b"]
    g.freeze()
    assert g.frozen
    with pytest.raises(nx.NetworkXError):
        g.add_node("c")


def test_merge_refuses_overlaps_unless_allowed():
    left, right = graph.DiGraph(), graph.DiGraph()
    left.add_edge("a", "b")
    right.add_edge("a", "c")
    with pytest.raises(ValueError, match="1 node"):
        graph.merge_graphs(left, right)
    merged = graph.merge_graphs(left, right, allow_overlaps=True)
    assert sorted(merged.edges) == [("a", "b"), ("a", "c")]
    with pytest.raises(ValueError, match="callable"):
        graph.merge_graphs(left, right, overlap_detector="no")


def test_tree_draws_walks_and_finds():
    root = _species()
    assert root.pformat() == (
        "animal\n|__mammal\n|  |__horse\n|  |__primate\n|     |__monkey\n|__reptile"
    )
    assert [n.item for n in root.dfs_iter()] == ["mammal", "horse", "primate", "monkey", "reptile"]
    assert [n.item for n in root.bfs_iter(right_to_left=True)] == [
        "mammal",
        "reptile",
        "horse",
        "primate",
        "monkey",
    ]
    monkey = root.find("monkey")
    assert [n.item for n in monkey.path_iter()] == ["monkey", "primate", "mammal", "animal"]
    assert root.find("monkey", only_direct=True) is None and "monkey" in root
    assert root.child_count(only_direct=False) == 5
    assert list(root.to_digraph().successors("animal")) == ["mammal", "reptile"]


def test_tree_removal_and_freezing():
    root = _species()
    assert root.remove("reptile").item == "reptile" and root.find("reptile") is None
    with pytest.raises(ValueError):
        root.remove("monkey", only_direct=True)
    root.freeze()
    with pytest.raises(tree.FrozenNode):
        root.add(tree.Node("bird"))


def test_timeout_converts_and_interrupts():
    t = timing.convert_to_timeout("1.5")
    assert t.value == 1.5 and timing.convert_to_timeout(t) is t
    for bad in ("abc", "-1", "", object()):
        with pytest.raises(ValueError):
            timing.convert_to_timeout(bad)
    t.interrupt()
    assert t.is_stopped() and t.wait() is True  # returns at once once interrupted
    t.reset()
    assert not t.is_stopped()
    # A wait another thread interrupts ends then, not at the timeout.
    long = timing.Timeout(60)
    threading.Timer(0.01, long.interrupt).start()
    assert long.wait() is True


def test_entity_logging_and_version():
    e = entity.Entity("conductor", "c1", {"host": "h"})
    assert e.to_dict() == {"kind": "conductor", "name": "c1", "metadata": {"host": "h"}}
    assert fe_logging.TRACE == fe_logging.BLATHER < logging.DEBUG
    assert version.version_string() == flowengine.__version__


def test_trace_logs_below_debug(caplog):
    log = fe_logging.getLogger("flowengine.test")
    with caplog.at_level(fe_logging.TRACE, logger="flowengine.test"):
        log.trace("deep %s", "detail")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("TRACE", "deep detail")]
