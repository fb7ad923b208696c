"""The execution graph in the compact form the engine runs on.

A compiled flow's execution graph (flow start/end nodes and atoms, see
:mod:`~flowengine.engines.action_engine.compiler`) is what the runtime walks
after every state change. Held as a networkx graph it costs about a
kilobyte per node (a dict of attributes per node and per edge, adjacency
dicts both ways); here nodes are numbers (their position in
``Topology.order``), each side's neighbours one flat array of numbers, plus
the node kinds and the few links that carry a decider. The compiler hands
the edges over as numbers and the runtime takes its order and neighbours as
numbers, so no name is looked up per edge (at 100,000 nodes each such
lookup missed the CPU caches, issue 38). The networkx view
(``Compilation.execution_graph``) is only built when someone asks for it.

Orders are the ones the networkx graph had: nodes in insertion order, each
node's neighbours in the order their edges were added, and
:meth:`Topology.topological` gives exactly what ``networkx.topological_sort``
gives on that graph (ready atoms are started in this order).
"""

from __future__ import annotations

import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

#: Flat neighbour runs: node i's neighbours are flat[at[i]:at[i + 1]].
Runs = tuple["array.array[int]", "array.array[int]"]


def grouped(keys: Sequence[int], values: Sequence[int], nodes: int) -> Runs:
    """``values`` gathered by ``keys`` (a counting sort), each group in input order.

    Returns ``(flat, at)``: the values of key i are ``flat[at[i]:at[i + 1]]``.
    Stable, so neighbours keep the order their edges were added in (the
    order networkx kept, which deciders are asked in).
    """
    at = array.array("q", bytes(8 * (nodes + 1)))
    for k in keys:
        at[k + 1] += 1
    for i in range(nodes):
        at[i + 1] += at[i]
    flat = array.array("q", bytes(8 * len(keys)))
    fill = at[:-1]
    for k, v in zip(keys, values):
        flat[fill[k]] = v
        fill[k] += 1
    return flat, at


class Decision(NamedTuple):
    """A decider on a link: ``decider(history) -> bool`` and how far a "no" reaches."""

    decider: Callable[..., Any]
    depth: Any


class Topology:
    """Node kinds, neighbours both ways and decider links of an execution graph.

    Nodes are numbered by their position in ``order``; the compiler numbers
    flow start/end nodes first and atoms from ``first_atom`` on.
    """

    __slots__ = (
        "order",
        "kinds",
        "index",
        "first_atom",
        "succ",
        "succ_at",
        "pred",
        "pred_at",
        "deciders",
    )

    def __init__(
        self,
        order: list[str],
        kinds: dict[str, str],
        first_atom: int,
        tails: Sequence[int],
        heads: Sequence[int],
        deciders: dict[tuple[str, str], Decision],
    ) -> None:
        """Edge k goes from node ``tails[k]`` to node ``heads[k]`` (numbers, in the order added)."""
        #: Every node, in insertion order (a node's number is its position).
        self.order = order
        #: Node name -> kind (task, retry, flow, flow_end).
        self.kinds = kinds
        #: Node name -> number.
        self.index = {n: i for i, n in enumerate(order)}
        #: Nodes numbered from here on are atoms.
        self.first_atom = first_atom
        nodes = len(order)
        # Flat arrays, not a tuple per node: no object per node for the
        # collector to move to its oldest generation and walk (issue 38).
        self.succ, self.succ_at = grouped(tails, heads, nodes)
        self.pred, self.pred_at = grouped(heads, tails, nodes)
        #: (from, to) -> Decision, for the links that carry a decider.
        self.deciders = deciders

    def preds_of(self, node: str) -> tuple[str, ...]:
        """``node``'s predecessors (edge order)."""
        i, order = self.index[node], self.order
        return tuple(order[j] for j in self.pred[self.pred_at[i] : self.pred_at[i + 1]])

    def succs_of(self, node: str) -> tuple[str, ...]:
        """``node``'s successors (edge order)."""
        i, order = self.index[node], self.order
        return tuple(order[j] for j in self.succ[self.succ_at[i] : self.succ_at[i + 1]])

    def topological_numbers(self) -> list[int]:
        """Node numbers by generations (Kahn): those with no predecessor first, in order."""
        nodes = len(self.order)
        succ, succ_at, pred_at = self.succ, self.succ_at, self.pred_at
        waiting = [pred_at[i + 1] - pred_at[i] for i in range(nodes)]
        ready = [i for i in range(nodes) if not waiting[i]]
        out: list[int] = []
        while ready:
            generation, ready = ready, []
            for node in generation:
                for child in succ[succ_at[node] : succ_at[node + 1]]:
                    left = waiting[child] - 1
                    waiting[child] = left
                    if not left:
                        ready.append(child)
            out.extend(generation)
        if len(out) != nodes:
            # The compiler refuses cycles; reaching this is a compiler bug.
            stuck = sorted(self.order[i] for i in range(nodes) if waiting[i])
            raise ValueError(f"execution graph has a cycle through {stuck[:5]}")
        return out

    def topological(self) -> list[str]:
        """Node names in :meth:`topological_numbers` order (``networkx.topological_sort``'s)."""
        order = self.order
        return [order[i] for i in self.topological_numbers()]

    def successors_renumbered(self, numbers: list[int]) -> Runs:
        """The successor runs with node ``numbers[k]`` renumbered ``k`` (a topological order)."""
        rank = [0] * len(numbers)
        for k, node in enumerate(numbers):
            rank[node] = k
        succ, succ_at = self.succ, self.succ_at
        flat, at = array.array("q"), array.array("q", [0])
        for node in numbers:
            flat.extend(map(rank.__getitem__, succ[succ_at[node] : succ_at[node + 1]]))
            at.append(len(flat))
        return flat, at

    def _reach(self, start: str, flat: array.array[int], at: array.array[int]) -> set[str]:
        seen: set[int] = set()
        stack = [self.index[start]]
        while stack:
            i = stack.pop()
            for nxt in flat[at[i] : at[i + 1]]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        order = self.order
        return {order[i] for i in seen}

    def descendants(self, node: str) -> set[str]:
        """Every node reachable from ``node`` (not including it)."""
        return self._reach(node, self.succ, self.succ_at)

    def ancestors(self, node: str) -> set[str]:
        """Every node with a path to ``node`` (not including it)."""
        return self._reach(node, self.pred, self.pred_at)

    def forward(self, node: str, through: Callable[[str], bool]) -> Iterator[str]:
        """Nodes reachable from ``node`` breadth first, entering only kinds ``through`` allows.

        Every node reached is yielded (whatever its kind); only those whose
        kind ``through`` accepts are walked on from.
        """
        order, kinds, succ, succ_at = self.order, self.kinds, self.succ, self.succ_at
        start = self.index[node]
        seen = {start}
        queue = [start]
        i = 0
        while i < len(queue):
            n = queue[i]
            i += 1
            for s in succ[succ_at[n] : succ_at[n + 1]]:
                if s in seen:
                    continue
                seen.add(s)
                name = order[s]
                yield name
                if through(kinds[name]):
                    queue.append(s)
