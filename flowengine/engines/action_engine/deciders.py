"""Edge deciders: links whose callable may veto running the atoms after them.

A vetoed atom (and, by the link's depth, some of its successors) moves to
IGNORE. The decision is taken late: when the atom is otherwise ready to run,
so the decider sees the results of the atoms it follows.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from flowengine import deciders as de

# Node kinds in the compiled execution graph.
TASK = "task"
RETRY = "retry"
FLOW = "flow"
FLOW_END = "flow_end"
ATOM_KINDS = frozenset((TASK, RETRY))
FLOW_KINDS = frozenset((FLOW, FLOW_END))


class EdgeDecider(NamedTuple):
    """A decider found on a link leading (maybe via flow nodes) into an atom."""

    from_node: str
    kind: str
    decider: Callable[..., Any]
    depth: Any


def _edge_decider(graph: Any, u: str, v: str) -> EdgeDecider | None:
    data = graph.adj[u][v]
    decider = data.get("decider")
    if decider is None:
        return None
    depth = data.get("decider_depth")
    if depth is None:
        depth = de.Depth.ALL
    return EdgeDecider(u, graph.nodes[u]["kind"], decider, de.Depth.translate(depth))


def edge_deciders_for(graph: Any, atom: str,
                      memo: dict[str, tuple[EdgeDecider, ...]]) -> tuple[EdgeDecider, ...]:
    """Deciders on links into ``atom``, and into the flows that start before it."""
    found: list[EdgeDecider] = []
    for u in graph.predecessors(atom):
        ed = _edge_decider(graph, u, atom)
        if ed is not None:
            found.append(ed)
        if graph.nodes[u]["kind"] == FLOW:
            found.extend(_behind_flow_start(graph, u, memo))
    return tuple(found)


def _behind_flow_start(graph: Any, start: str,
                       memo: dict[str, tuple[EdgeDecider, ...]]) -> tuple[EdgeDecider, ...]:
    # A decider on a link into a flow applies to every atom of that flow;
    # memoised per flow start node so each edge is looked at once.
    cached = memo.get(start)
    if cached is not None:
        return cached
    found: list[EdgeDecider] = []
    for u in graph.predecessors(start):
        ed = _edge_decider(graph, u, start)
        if ed is not None:
            found.append(ed)
        if graph.nodes[u]["kind"] == FLOW:
            found.extend(_behind_flow_start(graph, u, memo))
    memo[start] = result = tuple(found)
    return result


def _forward(graph: Any, atom: str, through: Callable[[str], bool]) -> Iterator[str]:
    """Atoms reachable forward from ``atom`` walking only nodes ``through`` allows."""
    seen = {atom}
    queue = collections.deque([atom])
    while queue:
        n = queue.popleft()
        for s in graph.successors(n):
            if s in seen:
                continue
            seen.add(s)
            kind = graph.nodes[s]["kind"]
            if kind in ATOM_KINDS:
                yield s
            if through(kind):
                queue.append(s)


def affected_atoms(graph: Any, atom: str, depth: Any) -> list[str]:
    """The atoms a veto at ``depth`` moves to IGNORE (``atom`` first)."""
    names = [atom]
    if depth == de.Depth.ALL:
        names.extend(_forward(graph, atom, lambda kind: True))
    elif depth == de.Depth.FLOW:
        # Successors within the same flow: never enter nested flows (nor leave
        # through the flow's end) and stop at retry controllers.
        names.extend(s for s in _forward(graph, atom, lambda kind: kind == TASK)
                     if graph.nodes[s]["kind"] == TASK)
    elif depth == de.Depth.NEIGHBORS:
        names.extend(s for s in graph.successors(atom) if graph.nodes[s]["kind"] == TASK)
    return names


def pick_depth(nay_voters: list[EdgeDecider]) -> Any:
    """The widest depth among the deciders that said no."""
    return de.pick_widest([ed.depth for ed in nay_voters])
