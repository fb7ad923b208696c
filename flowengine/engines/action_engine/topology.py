"""The execution graph in the compact form the engine runs on.

A compiled flow's execution graph (flow start/end nodes and atoms, see
:mod:`~flowengine.engines.action_engine.compiler`) is what the runtime walks
after every state change. Held as a networkx graph it costs about a
kilobyte per node (a dict of attributes per node and per edge, adjacency
dicts both ways); here it is one tuple of predecessors and one of
successors per node, the node kinds, and the few links that carry a
decider. The networkx view (``Compilation.execution_graph``) is only built
when someone asks for it.

Orders are the ones the networkx graph had: nodes in insertion order, each
node's neighbours in the order their edges were added, and
:meth:`Topology.topological` gives exactly what ``networkx.topological_sort``
gives on that graph (ready atoms are started in this order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

#: A node without neighbours on one side (shared: most atoms have one edge in/out).
_NONE: tuple[str, ...] = ()


def _gather(table: dict[str, str | list[str]], node: str, other: str) -> None:
    """Add ``other`` to ``node``'s entry: the name alone first, a list once there are two."""
    found = table.get(node)
    if found is None:
        table[node] = other
    elif isinstance(found, str):
        table[node] = [found, other]
    else:
        found.append(other)


def _as_tuple(found: str | list[str] | None) -> tuple[str, ...]:
    if found is None:
        return _NONE
    return (found,) if isinstance(found, str) else tuple(found)


class Decision(NamedTuple):
    """A decider on a link: ``decider(history) -> bool`` and how far a "no" reaches."""

    decider: Callable[..., Any]
    depth: Any


class Topology:
    """Node kinds, neighbours both ways and decider links of an execution graph."""

    __slots__ = ("order", "kinds", "preds", "succs", "deciders")

    def __init__(
        self,
        order: list[str],
        kinds: dict[str, str],
        edges: Iterable[tuple[str, str, Decision | None]],
    ) -> None:
        #: Every node, in insertion order.
        self.order = order
        #: Node name -> kind (task, retry, flow, flow_end).
        self.kinds = kinds
        # Neighbours gathered as a name while there is one, a list from the
        # second: a list per node would be n lists alive at once, which the
        # collector moves to its oldest generation and walks (issue 38).
        preds: dict[str, str | list[str]] = {}
        succs: dict[str, str | list[str]] = {}
        #: (from, to) -> Decision, for the links that carry a decider.
        self.deciders: dict[tuple[str, str], Decision] = {}
        for u, v, decision in edges:
            _gather(succs, u, v)
            _gather(preds, v, u)
            if decision is not None:
                self.deciders[(u, v)] = decision
        #: Node name -> its predecessors / successors (edge order).
        self.preds: dict[str, tuple[str, ...]] = {n: _as_tuple(preds.get(n)) for n in order}
        self.succs: dict[str, tuple[str, ...]] = {n: _as_tuple(succs.get(n)) for n in order}

    def topological(self) -> list[str]:
        """Nodes by generations (Kahn): those with no predecessor first, in insertion order."""
        succs = self.succs
        waiting = {n: len(p) for n, p in self.preds.items() if p}
        ready = [n for n in self.order if n not in waiting]
        out: list[str] = []
        while ready:
            generation, ready = ready, []
            for node in generation:
                for child in succs[node]:
                    left = waiting[child] - 1
                    if left:
                        waiting[child] = left
                    else:
                        del waiting[child]
                        ready.append(child)
            out.extend(generation)
        if waiting:
            # The compiler refuses cycles; reaching this is a compiler bug.
            raise ValueError(f"execution graph has a cycle through {sorted(waiting)[:5]}")
        return out

    def _reach(self, start: str, step: dict[str, tuple[str, ...]]) -> set[str]:
        seen: set[str] = set()
        stack = [start]
        while stack:
            for nxt in step[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    def descendants(self, node: str) -> set[str]:
        """Every node reachable from ``node`` (not including it)."""
        return self._reach(node, self.succs)

    def ancestors(self, node: str) -> set[str]:
        """Every node with a path to ``node`` (not including it)."""
        return self._reach(node, self.preds)

    def forward(self, node: str, through: Callable[[str], bool]) -> Iterator[str]:
        """Nodes reachable from ``node`` breadth first, entering only kinds ``through`` allows.

        Every node reached is yielded (whatever its kind); only those whose
        kind ``through`` accepts are walked on from.
        """
        seen = {node}
        queue = [node]
        i = 0
        while i < len(queue):
            n = queue[i]
            i += 1
            for s in self.succs[n]:
                if s in seen:
                    continue
                seen.add(s)
                yield s
                if through(self.kinds[s]):
                    queue.append(s)
