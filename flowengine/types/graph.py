"""Graphs as TaskFlow exposes them: networkx graphs with freezing, DOT export and merging.

``engine.compilation.execution_graph`` is a :class:`DiGraph`. The extra
methods are the ones TaskFlow users call: ``freeze()``, ``pformat()``,
``export_to_dot()``, ``no_predecessors_iter()``/``no_successors_iter()``,
``is_directed_acyclic()`` and :func:`merge_graphs`. networkx keeps insertion
order, so the ``Ordered*`` names are the same classes' ordered twins, kept for
code written against TaskFlow.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self, TypeAlias

import networkx as nx

__all__ = ["DiGraph", "Graph", "OrderedDiGraph", "OrderedGraph", "merge_graphs"]

# networkx's classes are generic in its stubs only (not subscriptable at run
# time); these graphs hold any hashable node, as TaskFlow's do.
if TYPE_CHECKING:
    _NxGraph: TypeAlias = nx.Graph[Any]
    _NxDiGraph: TypeAlias = nx.DiGraph[Any]
else:
    _NxGraph = nx.Graph
    _NxDiGraph = nx.DiGraph

#: DOT identifiers that need no quotes (the rest are quoted and escaped).
_DOT_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$|^-?(\.[0-9]+|[0-9]+(\.[0-9]*)?)$")


def _dot_id(value: Any) -> str:
    text = str(value)
    if _DOT_ID.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot_attrs(attrs: dict[str, Any]) -> str:
    if not attrs:
        return ""
    return " [" + ", ".join(f"{_dot_id(k)}={_dot_id(v)}" for k, v in attrs.items()) + "]"


class _GraphExtras(_NxGraph):
    """What TaskFlow's graph types add to networkx's (shared by the four classes).

    It derives from nx.Graph so that the methods are checked against
    networkx's; DiGraph lists it before nx.DiGraph, so the method order is
    the one a plain mixin gives.
    """

    #: Whether the graph can no longer change (nx.NetworkXError on any change);
    #: networkx's freeze() sets it on the instance.
    frozen = False

    def freeze(self) -> Self:
        """Make the graph read-only (in place); returns it."""
        nx.freeze(self)
        return self

    def export_to_dot(self) -> str:
        """The graph as a ``strict`` DOT document (nodes, then edges, with attributes)."""
        directed = isinstance(self, nx.DiGraph)
        kind, arrow = ("digraph", "->") if directed else ("graph", "--")
        name = str(self.name or "G").replace("\\", "\\\\").replace('"', '\\"')
        lines = [f'strict {kind} "{name}" {{']
        lines += [f"{_dot_id(n)}{_dot_attrs(a)};" for n, a in self.nodes(data=True)]
        lines += [
            f"{_dot_id(u)} {arrow} {_dot_id(v)}{_dot_attrs(a)};"
            for u, v, a in self.edges(data=True)
        ]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def pformat(self) -> str:
        """A human readable description: name, type, frozen, nodes, edges, density."""
        lines = [
            f"Name: {self.name}",
            f"Type: {type(self).__name__}",
            f"Frozen: {self.frozen}",
            f"Density: {nx.density(self):0.3f}",
            f"Nodes: {len(self.nodes)}",
        ]
        lines += [f"  - {n}" for n in self.nodes]
        lines.append(f"Edges: {len(self.edges)}")
        arrow = "->" if isinstance(self, nx.DiGraph) else "--"
        for u, v, attrs in self.edges(data=True):
            lines.append(f"  {u} {arrow} {v}" + (f" ({attrs})" if attrs else ""))
        return "\n".join(lines)


class Graph(_GraphExtras, _NxGraph):
    """An undirected graph with TaskFlow's extra methods."""


class OrderedGraph(Graph):
    """Graph keeping insertion order (every networkx graph does; kept for TaskFlow code)."""


class DiGraph(_GraphExtras, _NxDiGraph):
    """A directed graph with TaskFlow's extra methods (the compiled execution graph)."""

    def is_directed_acyclic(self) -> bool:
        """Whether the graph has no cycle."""
        return nx.is_directed_acyclic_graph(self)

    def no_successors_iter(self) -> Iterator[Any]:
        """Nodes nothing follows (the sinks)."""
        return (n for n, degree in self.out_degree() if degree == 0)

    def no_predecessors_iter(self) -> Iterator[Any]:
        """Nodes nothing precedes (the sources)."""
        return (n for n, degree in self.in_degree() if degree == 0)

    def topological_sort(self) -> list[Any]:
        """Nodes in an order compatible with every edge (NetworkXUnfeasible on a cycle)."""
        return list(nx.topological_sort(self))

    def bfs_predecessors_iter(self, node: Any) -> Iterator[Any]:
        """Every node ``node`` can be reached from, nearest first."""
        seen = {node}
        frontier = [node]
        while frontier:
            following = []
            for current in frontier:
                for pred in self.predecessors(current):
                    if pred not in seen:
                        seen.add(pred)
                        following.append(pred)
                        yield pred
            frontier = following


class OrderedDiGraph(DiGraph):
    """DiGraph keeping insertion order (every networkx graph does; kept for TaskFlow code)."""


def _common_nodes(to_graph: Any, from_graph: Any) -> int:
    return sum(1 for node in from_graph.nodes if node in to_graph)


def merge_graphs(
    graph: Any,
    *graphs: Any,
    overlap_detector: Callable[[Any, Any], int] = _common_nodes,
    allow_overlaps: bool = False,
) -> Any:
    """A new graph holding ``graph`` and every one of ``graphs``.

    Raises ValueError when ``overlap_detector(merged_so_far, next_graph)``
    finds shared nodes and ``allow_overlaps`` is false, or when the detector
    is not callable.
    """
    if not callable(overlap_detector):
        raise ValueError(
            f"Overlap detection callback expected to be callable, got {overlap_detector!r}"
        )
    merged = graph.copy()
    for other in graphs:
        overlaps = overlap_detector(merged, other)
        if overlaps and not allow_overlaps:
            raise ValueError(
                f"Can not merge graphs {merged.name!r} and {other.name!r}:"
                f" {overlaps} node(s) overlap"
            )
        merged = nx.compose(merged, other)
    return merged
