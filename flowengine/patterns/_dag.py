"""A small directed acyclic graph that stays topologically ordered as it grows.

Graph flows add nodes and links one at a time; re-checking the whole graph for
cycles after every change (as a copy-and-validate approach does) costs
O(n) per change and O(n^2) to build a flow.  This graph instead keeps a
topological order up to date with the Pearce-Kelly algorithm: an edge that
agrees with the current order is accepted in O(1); one that does not only
searches the nodes whose order lies between its two ends.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

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
_NO_EDGES: dict[int, _Edge] = {}


def _own(table: list[dict[int, _Edge]], node: int) -> dict[int, _Edge]:
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
    """Directed acyclic graph with edge data and an incrementally kept topological order.

    Nodes are numbered as they are added and the edges are kept between
    those numbers: an adjacency dict of ints and symbol strings holds no
    object the garbage collector tracks, so CPython stops tracking it, and
    a full collection over a 100,000-task flow walks two objects per task
    less than with adjacency keyed by the nodes themselves.
    """

    __slots__ = ("_ids", "_nodes", "_succ", "_pred", "_ord")

    def __init__(self) -> None:
        # node -> its number (in insertion order); numbers are never reused.
        self._ids: dict[_N, int] = {}
        # number -> node (None once removed).
        self._nodes: list[_N | None] = []
        # number -> {successor's (predecessor's) number: edge}.
        self._succ: list[dict[int, _Edge]] = []
        self._pred: list[dict[int, _Edge]] = []
        # number -> position in the topological order (distinct, below
        # len(_nodes): a new node's number is its position).
        self._ord: list[int] = []

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, node: object) -> bool:
        return node in self._ids

    def _node(self, number: int) -> _N:
        return cast(_N, self._nodes[number])

    def _map(self, numbers: Iterable[int]) -> Iterator[_N]:
        return cast(Iterator[_N], map(self._nodes.__getitem__, numbers))

    def copy(self) -> OrderedDAG[_N]:
        """Return a copy (edge data dicts are copied one level deep)."""
        other: OrderedDAG[_N] = OrderedDAG()
        other._ids = dict(self._ids)
        other._nodes = list(self._nodes)
        other._succ = [
            {v: d if isinstance(d, str) else dict(d) for v, d in adj.items()} if adj else _NO_EDGES
            for adj in self._succ
        ]
        other._pred = [_NO_EDGES] * len(self._pred)
        for u, adj in enumerate(other._succ):
            for v, d in adj.items():
                _own(other._pred, v)[u] = d
        other._ord = list(self._ord)
        return other

    def add_node(self, node: _N) -> None:
        """Add ``node`` (last in the order) unless it is already present."""
        if node not in self._ids:
            number = len(self._nodes)
            self._ids[node] = number
            self._nodes.append(node)
            self._succ.append(_NO_EDGES)
            self._pred.append(_NO_EDGES)
            self._ord.append(number)

    def remove_node(self, node: _N) -> None:
        """Remove ``node`` and its edges (the remaining order stays valid)."""
        number = self._ids.pop(node)
        for v in self._succ[number]:
            del self._pred[v][number]
        for u in self._pred[number]:
            del self._succ[u][number]
        self._succ[number] = self._pred[number] = _NO_EDGES
        self._nodes[number] = None

    def has_edge(self, u: _N, v: _N) -> bool:
        """True if the edge u -> v exists."""
        iu, iv = self._ids.get(u), self._ids.get(v)
        return iu is not None and iv is not None and iv in self._succ[iu]

    def edge_data(self, u: _N, v: _N) -> dict[str, Any] | None:
        """The data dict of edge u -> v (changes to it stay), or None if there is no such edge."""
        iu, iv = self._ids.get(u), self._ids.get(v)
        if iu is None or iv is None:
            return None
        return self._edge_data(iu, iv)

    def _edge_data(self, iu: int, iv: int) -> dict[str, Any] | None:
        value = self._succ[iu].get(iv)
        if isinstance(value, str):
            # The caller may change it: from now on the edge keeps a dict.
            value = self._succ[iu][iv] = self._pred[iv][iu] = _expand(value)
        return value

    def add_reason_edge(self, u: _N, v: _N, symbol: str) -> None:
        """Add u -> v made for ``symbol`` (or add ``symbol`` to the edge's reasons).

        Raises CycleError, leaving the graph unchanged, if the edge would close
        a cycle.
        """
        iu, iv = self._ids[u], self._ids[v]
        if iv in self._succ[iu]:
            data = self._edge_data(iu, iv)
            assert data is not None  # the edge exists
            data[REASONS] = set(data.get(REASONS, ())) | {symbol}
            return
        self._check_order(iu, iv)
        _own(self._succ, iu)[iv] = symbol
        _own(self._pred, iv)[iu] = symbol

    def add_edge(self, u: _N, v: _N, data: dict[str, Any] | None = None) -> None:
        """Add u -> v (or merge ``data`` into an existing edge).

        Raises CycleError, leaving the graph unchanged, if the edge would close
        a cycle.
        """
        iu, iv = self._ids[u], self._ids[v]
        if iv in self._succ[iu]:
            existing = self._edge_data(iu, iv)
            if data and existing is not None:
                existing.update(data)
            return
        self._check_order(iu, iv)
        d = dict(data) if data else {}
        _own(self._succ, iu)[iv] = d
        _own(self._pred, iv)[iu] = d

    def _check_order(self, u: int, v: int) -> None:
        """Make the order put ``u`` before ``v`` (CycleError if it cannot)."""
        if u == v:
            node = self._node(u)
            raise CycleError([node, node])
        lower, upper = self._ord[v], self._ord[u]
        if lower < upper:
            self._reorder(u, v, lower, upper)

    def remove_edge(self, u: _N, v: _N) -> None:
        """Remove the edge u -> v (KeyError if absent)."""
        iu, iv = self._ids[u], self._ids[v]
        del self._succ[iu][iv]
        del self._pred[iv][iu]

    def _reorder(self, u: int, v: int, lower: int, upper: int) -> None:
        # Nodes reachable from v whose order is not past u's must move after u;
        # reaching u itself means the new edge would close a cycle.
        order = self._ord
        forward: list[int] = [v]
        parent: dict[int, int] = {v: v}
        stack = [v]
        while stack:
            node = stack.pop()
            for nxt in self._succ[node]:
                if nxt == u:
                    path = [node]
                    while path[-1] != v:
                        path.append(parent[path[-1]])
                    path.reverse()
                    raise CycleError([self._node(i) for i in (u, *path, u)])
                if nxt not in parent and order[nxt] < upper:
                    parent[nxt] = node
                    forward.append(nxt)
                    stack.append(nxt)
        # Nodes that reach u and sit after v's position must move before v.
        backward: list[int] = [u]
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
        return iter(self._ids)

    def topological(self) -> list[_N]:
        """Nodes in a topological order (stable: ties keep insertion order)."""
        return list(self._map(sorted(self._ids.values(), key=self._ord.__getitem__)))

    def edges(self) -> Iterator[tuple[_N, _N, dict[str, Any]]]:
        """All edges as (u, v, data); for edges made for one symbol, a fresh data dict."""
        nodes = self._nodes
        for u, iu in self._ids.items():
            for iv, d in self._succ[iu].items():
                yield u, cast(_N, nodes[iv]), _expand(d)

    def edges_beyond_reasons(self) -> Iterator[tuple[_N, _N, dict[str, Any] | None]]:
        """All edges as (u, v, data), data None for edges made for one symbol (no dict made)."""
        nodes = self._nodes
        for u, iu in self._ids.items():
            for iv, d in self._succ[iu].items():
                yield u, cast(_N, nodes[iv]), None if isinstance(d, str) else d

    def numbered(self) -> tuple[list[_N], Iterator[tuple[int, int, dict[str, Any] | None]]]:
        """Nodes in :meth:`topological` order, and :meth:`edges_beyond_reasons` by position.

        Each edge is ``(u, v, data)`` with ``u``, ``v`` positions in that
        node list (same edge order): the engine's compiler needs positions,
        and finding them here costs a list slot per edge end where looking
        the nodes up afterwards costs a dict probe each (issue 38).
        """
        numbers = sorted(self._ids.values(), key=self._ord.__getitem__)
        position = [0] * len(self._nodes)  # slots of removed numbers stay unused
        for pos, number in enumerate(numbers):
            position[number] = pos
        succ = self._succ

        def links() -> Iterator[tuple[int, int, dict[str, Any] | None]]:
            for iu in self._ids.values():
                pu = position[iu]
                for iv, d in succ[iu].items():
                    yield pu, position[iv], None if isinstance(d, str) else d

        return list(self._map(numbers)), links()

    def successors(self, node: _N) -> Iterator[_N]:
        """Direct successors of ``node``."""
        return self._map(self._succ[self._ids[node]])

    def predecessors(self, node: _N) -> Iterator[_N]:
        """Direct predecessors of ``node``."""
        return self._map(self._pred[self._ids[node]])

    def number_of_edges(self) -> int:
        """How many edges the graph holds."""
        return sum(len(adj) for adj in self._succ)

    def _ancestor_numbers(self, node: _N) -> set[int]:
        pred = self._pred
        seen: set[int] = set()
        stack = [self._ids[node]]
        while stack:
            for prv in pred[stack.pop()]:
                if prv not in seen:
                    seen.add(prv)
                    stack.append(prv)
        return seen

    def ancestors(self, node: _N) -> set[_N]:
        """Every node with a path to ``node`` (not including it)."""
        return set(self._map(self._ancestor_numbers(node)))

    def find_ancestor(self, node: _N, wanted: Any) -> bool:
        """True if some ancestor ``a`` of ``node`` has ``wanted(a)`` true."""
        pred, nodes = self._pred, self._nodes
        seen: set[int] = set()
        stack = [self._ids[node]]
        while stack:
            for prv in pred[stack.pop()]:
                if prv not in seen:
                    if wanted(nodes[prv]):
                        return True
                    seen.add(prv)
                    stack.append(prv)
        return False
