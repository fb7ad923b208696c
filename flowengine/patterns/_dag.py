"""A small directed acyclic graph that stays topologically ordered as it grows.

Graph flows add nodes and links one at a time; re-checking the whole graph for
cycles after every change (as a copy-and-validate approach does) costs
O(n) per change and O(n^2) to build a flow.  This graph instead keeps a
topological order up to date with the Pearce-Kelly algorithm: an edge that
agrees with the current order is accepted in O(1); one that does not only
searches the nodes whose order lies between its two ends.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any, Generic, TypeVar

#: A node: anything hashable (graph flows use their atoms and subflows).
_N = TypeVar("_N", bound=Hashable)

#: Edge-data key of the symbols that made a link (``flow.LINK_REASONS``).
REASONS = "reasons"

#: What an edge holds: its data dict, or just the one symbol that made it
#: (``{REASONS: {symbol}}`` expanded on demand). Graph flows link almost
#: every pair of atoms for one symbol; a dict and a set per edge cost 400
#: bytes, the symbol itself nothing.
_Edge = dict[str, Any] | str


#: The adjacency of a node without edges (on that side), shared by all of
#: them and never changed: an edge's first end gets a dict of its own (see
#: _own). A graph flow's sources and sinks are often half its atoms, and an
#: empty dict costs 64 bytes.
_NO_EDGES: dict[Any, _Edge] = {}


def _own(table: dict[Any, dict[Any, _Edge]], node: Any) -> dict[Any, _Edge]:
    """``table[node]``, replacing the shared empty adjacency by a dict of its own."""
    adj = table[node]
    if adj is _NO_EDGES:
        adj = table[node] = {}
    return adj


def _expand(value: _Edge) -> dict[str, Any]:
    return {REASONS: {value}} if isinstance(value, str) else value


class CycleError(ValueError):
    """Adding an edge would close a cycle; ``cycle`` lists its nodes in order."""

    def __init__(self, cycle: list[Any]) -> None:
        super().__init__(cycle)
        self.cycle = cycle


class OrderedDAG(Generic[_N]):
    """Directed acyclic graph with edge data and an incrementally kept topological order."""

    __slots__ = ("_succ", "_pred", "_ord", "_next")

    def __init__(self) -> None:
        self._succ: dict[_N, dict[_N, _Edge]] = {}
        self._pred: dict[_N, dict[_N, _Edge]] = {}
        self._ord: dict[_N, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._succ)

    def __contains__(self, node: object) -> bool:
        return node in self._succ

    def copy(self) -> OrderedDAG[_N]:
        """Return a copy (edge data dicts are copied one level deep)."""
        other: OrderedDAG[_N] = OrderedDAG()
        other._succ = {
            u: {v: d if isinstance(d, str) else dict(d) for v, d in adj.items()}
            for u, adj in self._succ.items()
        }
        other._pred = {v: {} for v in self._succ}
        for u, adj in other._succ.items():
            for v, d in adj.items():
                other._pred[v][u] = d
        other._ord = dict(self._ord)
        other._next = self._next
        return other

    def add_node(self, node: _N) -> None:
        """Add ``node`` (last in the order) unless it is already present."""
        if node not in self._succ:
            self._succ[node] = _NO_EDGES
            self._pred[node] = _NO_EDGES
            self._ord[node] = self._next
            self._next += 1

    def remove_node(self, node: _N) -> None:
        """Remove ``node`` and its edges (the remaining order stays valid)."""
        for v in self._succ.pop(node):
            del self._pred[v][node]
        for u in self._pred.pop(node):
            del self._succ[u][node]
        del self._ord[node]

    def has_edge(self, u: _N, v: _N) -> bool:
        """True if the edge u -> v exists."""
        return v in self._succ.get(u, ())

    def edge_data(self, u: _N, v: _N) -> dict[str, Any] | None:
        """The data dict of edge u -> v (changes to it stay), or None if there is no such edge."""
        value = self._succ.get(u, {}).get(v)
        if isinstance(value, str):
            # The caller may change it: from now on the edge keeps a dict.
            value = self._succ[u][v] = self._pred[v][u] = _expand(value)
        return value

    def add_reason_edge(self, u: _N, v: _N, symbol: str) -> None:
        """Add u -> v made for ``symbol`` (or add ``symbol`` to the edge's reasons).

        Raises CycleError, leaving the graph unchanged, if the edge would close
        a cycle.
        """
        if v in self._succ[u]:
            data = self.edge_data(u, v)
            assert data is not None  # the edge exists
            data[REASONS] = set(data.get(REASONS, ())) | {symbol}
            return
        self._check_order(u, v)
        _own(self._succ, u)[v] = symbol
        _own(self._pred, v)[u] = symbol

    def add_edge(self, u: _N, v: _N, data: dict[str, Any] | None = None) -> None:
        """Add u -> v (or merge ``data`` into an existing edge).

        Raises CycleError, leaving the graph unchanged, if the edge would close
        a cycle.
        """
        if v in self._succ[u]:
            existing = self.edge_data(u, v)
            if data and existing is not None:
                existing.update(data)
            return
        self._check_order(u, v)
        d = dict(data) if data else {}
        _own(self._succ, u)[v] = d
        _own(self._pred, v)[u] = d

    def _check_order(self, u: _N, v: _N) -> None:
        """Make the order put ``u`` before ``v`` (CycleError if it cannot)."""
        if u == v:
            raise CycleError([u, u])
        lower, upper = self._ord[v], self._ord[u]
        if lower < upper:
            self._reorder(u, v, lower, upper)

    def remove_edge(self, u: _N, v: _N) -> None:
        """Remove the edge u -> v (KeyError if absent)."""
        del self._succ[u][v]
        del self._pred[v][u]

    def _reorder(self, u: _N, v: _N, lower: int, upper: int) -> None:
        # Nodes reachable from v whose order is not past u's must move after u;
        # reaching u itself means the new edge would close a cycle.
        order = self._ord
        forward: list[_N] = [v]
        parent: dict[_N, _N] = {v: v}
        stack = [v]
        while stack:
            node = stack.pop()
            for nxt in self._succ[node]:
                if nxt == u:
                    path = [node]
                    while path[-1] != v:
                        path.append(parent[path[-1]])
                    path.reverse()
                    raise CycleError([u, *path, u])
                if nxt not in parent and order[nxt] < upper:
                    parent[nxt] = node
                    forward.append(nxt)
                    stack.append(nxt)
        # Nodes that reach u and sit after v's position must move before v.
        backward: list[_N] = [u]
        seen = {u}
        stack = [u]
        while stack:
            node = stack.pop()
            for prv in self._pred[node]:
                if prv not in seen and order[prv] > lower:
                    seen.add(prv)
                    backward.append(prv)
                    stack.append(prv)
        backward.sort(key=order.__getitem__)
        forward.sort(key=order.__getitem__)
        slots = sorted(order[n] for n in backward + forward)
        for node, slot in zip(backward + forward, slots):
            order[node] = slot

    def nodes(self) -> Iterator[_N]:
        """Nodes in insertion order."""
        return iter(self._succ)

    def topological(self) -> list[_N]:
        """Nodes in a topological order (stable: ties keep insertion order)."""
        return sorted(self._succ, key=self._ord.__getitem__)

    def edges(self) -> Iterator[tuple[_N, _N, dict[str, Any]]]:
        """All edges as (u, v, data); for edges made for one symbol, a fresh data dict."""
        for u, adj in self._succ.items():
            for v, d in adj.items():
                yield u, v, _expand(d)

    def edges_beyond_reasons(self) -> Iterator[tuple[_N, _N, dict[str, Any] | None]]:
        """All edges as (u, v, data), data None for edges made for one symbol (no dict made)."""
        for u, adj in self._succ.items():
            for v, d in adj.items():
                yield u, v, None if isinstance(d, str) else d

    def successors(self, node: _N) -> Iterator[_N]:
        """Direct successors of ``node``."""
        return iter(self._succ[node])

    def predecessors(self, node: _N) -> Iterator[_N]:
        """Direct predecessors of ``node``."""
        return iter(self._pred[node])

    def number_of_edges(self) -> int:
        """How many edges the graph holds."""
        return sum(len(adj) for adj in self._succ.values())

    def ancestors(self, node: _N) -> set[_N]:
        """Every node with a path to ``node`` (not including it)."""
        seen: set[_N] = set()
        stack = [node]
        while stack:
            for prv in self._pred[stack.pop()]:
                if prv not in seen:
                    seen.add(prv)
                    stack.append(prv)
        return seen

    def find_ancestor(self, node: _N, wanted: Any) -> bool:
        """True if some ancestor ``a`` of ``node`` has ``wanted(a)`` true."""
        seen: set[_N] = set()
        stack = [node]
        while stack:
            for prv in self._pred[stack.pop()]:
                if prv not in seen:
                    if wanted(prv):
                        return True
                    seen.add(prv)
                    stack.append(prv)
        return False
