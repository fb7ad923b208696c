"""Edge deciders: links whose callable may veto running the atoms after them.

A vetoed atom (and, by the link's depth, some of its successors) moves to
IGNORE. The decision is taken late: when the atom is otherwise ready to run,
so the decider sees the results of the atoms it follows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from flowengine import deciders as de
from flowengine.engines.action_engine.topology import Topology

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


def _edge_decider(topology: Topology, u: str, v: str) -> EdgeDecider | None:
    decision = topology.deciders.get((u, v))
    if decision is None:
        return None
    depth = decision.depth if decision.depth is not None else de.Depth.ALL
    return EdgeDecider(u, topology.kinds[u], decision.decider, de.Depth.translate(depth))


def edge_deciders_for(
    topology: Topology, atom: str, memo: dict[str, tuple[EdgeDecider, ...]]
) -> tuple[EdgeDecider, ...]:
    """Deciders on links into ``atom``, and into the flows that start before it."""
    found: list[EdgeDecider] = []
    for u in topology.preds_of(atom):
        ed = _edge_decider(topology, u, atom)
        if ed is not None:
            found.append(ed)
        if topology.kinds[u] == FLOW:
            found.extend(_behind_flow_start(topology, u, memo))
    return tuple(found)


def _behind_flow_start(
    topology: Topology, start: str, memo: dict[str, tuple[EdgeDecider, ...]]
) -> tuple[EdgeDecider, ...]:
    # A decider on a link into a flow applies to every atom of that flow;
    # memoised per flow start node so each edge is looked at once.
    cached = memo.get(start)
    if cached is not None:
        return cached
    found: list[EdgeDecider] = []
    for u in topology.preds_of(start):
        ed = _edge_decider(topology, u, start)
        if ed is not None:
            found.append(ed)
        if topology.kinds[u] == FLOW:
            found.extend(_behind_flow_start(topology, u, memo))
    memo[start] = result = tuple(found)
    return result


def affected_atoms(topology: Topology, atom: str, depth: Any) -> list[str]:
    """The atoms a veto at ``depth`` moves to IGNORE (``atom`` first)."""
    kinds = topology.kinds
    names = [atom]
    if depth == de.Depth.ALL:
        names.extend(s for s in topology.forward(atom, lambda kind: True) if kinds[s] in ATOM_KINDS)
    elif depth == de.Depth.FLOW:
        # Successors within the same flow: never enter nested flows (nor leave
        # through the flow's end) and stop at retry controllers.
        names.extend(
            s for s in topology.forward(atom, lambda kind: kind == TASK) if kinds[s] == TASK
        )
    elif depth == de.Depth.NEIGHBORS:
        names.extend(s for s in topology.succs_of(atom) if kinds[s] == TASK)
    return names


def pick_depth(nay_voters: list[EdgeDecider]) -> Any:
    """The widest depth among the deciders that said no."""
    return de.pick_widest([ed.depth for ed in nay_voters])
