"""Compile a flow (or a single atom) into an execution graph plus scoping tables.

The compiler walks the pattern tree once and produces a :class:`Compilation`:

* ``execution_graph``: a networkx DiGraph whose nodes are names (built on
  first use; the engine runs on the same graph in compact form, ``topology``).  Each flow
  becomes a ``flow`` node and a ``flow_end`` node bracketing its contents, so
  linking two subflows costs one edge whatever their sizes.  A flow's retry
  controller comes right after the flow node and before all of its contents.
* Scoping: for every atom and every symbol it consumes, the ordered tuple of
  atoms that may provide it.  The rule is TaskFlow's: an atom sees providers
  that run before it; the nearest enclosing flow level is searched first,
  and within a level the latest provider comes first.  Two equally near
  providers with no order between them make the lookup ambiguous.

Everything is computed in time roughly linear in atoms + links: ancestor
questions are only asked between children of one flow, only for providers
of a symbol somebody consumes, and answered by a bounded backward search.
"""

from __future__ import annotations

import array
import threading
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from flowengine import exceptions as exc
from flowengine import flow as flow_mod
from flowengine import retry as retry_mod
from flowengine import task as task_mod
from flowengine.deciders import Depth
from flowengine.engines.action_engine import scopes
from flowengine.engines.action_engine import topology as topo
from flowengine.engines.action_engine.scopes import Ambiguity
from flowengine.utils import gc_freeze

if TYPE_CHECKING:
    from flowengine.types import graph as graph_types

__all__ = [
    "ATOMS",
    "FLOW",
    "FLOWS",
    "FLOW_END",
    "RETRY",
    "TASK",
    "Ambiguity",
    "ArgSpec",
    "Compilation",
    "PatternCompiler",
]

#: Node ``kind`` values in the execution graph.
TASK = "task"
RETRY = "retry"
FLOW = "flow"
FLOW_END = "flow_end"
ATOMS = (TASK, RETRY)
FLOWS = (FLOW, FLOW_END)


class ArgSpec(NamedTuple):
    """How one argument of an atom's method is found: its symbol and providers."""

    name: str
    symbol: str
    providers: tuple[str, ...]
    optional: bool


#: Link metadata the execution graph uses (the rest, e.g. reasons, is not kept).
_KEPT_LINK_KEYS = (flow_mod.LINK_DECIDER, flow_mod.LINK_DECIDER_DEPTH, flow_mod.LINK_INVARIANT)


_INVARIANT: dict[str, Any] = {flow_mod.LINK_INVARIANT: True}

#: Most predecessors of a flow's item gathered in a tuple copied at each
#: new one (see _Builder._walk); past it a list (copies grow as its square).
_PREDS_COPIED = 16


def _kept(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the compilation keeps of a link's metadata (None: nothing, the usual case)."""
    if not meta:
        return None
    kept = {k: meta[k] for k in _KEPT_LINK_KEYS if meta.get(k) is not None}
    if len(kept) == 1 and flow_mod.LINK_INVARIANT in kept:
        # Pattern-imposed links (every link of a linear flow): one shared value.
        return _INVARIANT if kept[flow_mod.LINK_INVARIANT] else None
    return kept or None


def _label(item: Any) -> str:
    name = getattr(item, "name", None)
    return name if isinstance(name, str) else repr(item)


class Compilation:
    """The read-only result of compiling a flow: graph, order and scoping tables."""

    TASK = TASK
    RETRY = RETRY
    FLOW = FLOW
    FLOW_END = FLOW_END

    def __init__(
        self,
        root: Any,
        topology: topo.Topology,
        retries: dict[str, str],
        atoms: dict[str, Any],
        order: tuple[str, ...],
        parents: dict[str, scopes.Unit],
        index: dict[str, int],
        units: dict[str, scopes.Unit],
        root_unit: scopes.Unit,
        providers: dict[str, scopes.ProviderTable],
        ambiguities: dict[tuple[str, str], Ambiguity],
        outside: tuple[str, ...],
        freeze: bool = True,
    ) -> None:
        self._root = root
        self._topology = topology
        self._retries = retries
        self._freeze = freeze
        self._graph: graph_types.DiGraph | None = None
        self._graph_lock = threading.Lock()
        self._outside = outside
        self._atoms = atoms
        self._order = order
        self._parents = parents
        self._index = index
        self._scopes: dict[str, tuple[tuple[str, ...], ...]] = {}
        self._units = units
        self._root_unit = root_unit
        self._providers = providers
        self._ambiguities = ambiguities

    # -- structure ----------------------------------------------------------

    @property
    def root(self) -> Any:
        """The flow (or atom) that was compiled."""
        return self._root

    @property
    def execution_graph(self) -> graph_types.DiGraph:
        """The execution graph (frozen unless compiled with ``freeze=False``).

        Nodes are names.  Node attrs: ``kind`` (task/retry/flow/flow_end);
        atoms have ``atom`` (the object) and ``retry`` (nearest enclosing
        retry name or None); flow and flow_end nodes have ``flow`` (the Flow)
        and ``end`` / ``start`` (the matching node name).  Edge attrs:
        ``invariant`` (bool: ordering imposed by the pattern), ``decider``
        (callable or None) and ``decider_depth`` (a Depth when a decider is
        set, else None).  Built on first use: the engine itself runs on
        :attr:`topology`, which costs a fraction of the memory.
        """
        graph = self._graph
        if graph is None:
            with self._graph_lock:
                if self._graph is None:
                    self._graph = build_graph(self, self._freeze)
                graph = self._graph
        return graph

    @property
    def topology(self) -> topo.Topology:
        """The execution graph as the engine walks it (same nodes, edges and orders)."""
        return self._topology

    def units_in_order(self) -> list[scopes.Unit]:
        """The compiled flows' records, outermost first (internal)."""
        return list(self._units.values())

    def needing_outside_values(self) -> tuple[str, ...]:
        """Atoms (topological order) with a required symbol no atom in scope provides.

        Only these can lack arguments at validate time: for the others every
        required argument has a provider.
        """
        return self._outside

    @property
    def root_node(self) -> str:
        """Name of the root flow's start node (its end is ``flow_end_of(root_node)``)."""
        return self._root_unit.node

    @property
    def atoms(self) -> dict[str, Any]:
        """Atom name -> atom object, in topological order (do not mutate)."""
        return self._atoms

    @property
    def topological_order(self) -> tuple[str, ...]:
        """Atom names in an order compatible with every edge (retries before their flows)."""
        return self._order

    def tasks(self) -> Iterator[Any]:
        """Task objects in topological order."""
        index = self._index
        return (self._atoms[n] for n in self._order if index[n] != -1)

    def retries(self) -> Iterator[Any]:
        """Retry objects in topological order."""
        index = self._index
        return (self._atoms[n] for n in self._order if index[n] == -1)

    def kind(self, name: str) -> str:
        """The ``kind`` of a node (KeyError if unknown)."""
        return self._topology.kinds[name]

    def parent_flow(self, name: str) -> str | None:
        """Start node name of the flow directly containing atom or flow node ``name``.

        A retry's parent is the flow it controls; the root flow has None.
        """
        unit = self._parents.get(name)
        if unit is not None:
            return unit.node
        unit = self._units[name]
        return unit.parent.node if unit.parent is not None else None

    def flow_end_of(self, flow_node: str) -> str:
        """The ``flow_end`` node matching a ``flow`` start node."""
        return self._units[flow_node].end

    def flow_start_of(self, end_node: str) -> str:
        """The ``flow`` start node matching a ``flow_end`` node (KeyError if none)."""
        for unit in self._units.values():
            if unit.end == end_node:
                return unit.node
        raise KeyError(end_node)

    def retry_of(self, name: str) -> str | None:
        """Nearest retry controlling atom ``name`` (for a retry: the one enclosing its flow)."""
        if name not in self._atoms:
            raise KeyError(name)
        return self._retries.get(name)

    def controlled_by(self, retry_name: str) -> tuple[str, ...]:
        """Atoms (topological order, nested flows included) in the flow a retry controls."""
        unit = self._parents[retry_name]
        if unit.retry != retry_name:
            raise ValueError(f"'{retry_name}' is not a retry controller")
        return self._order[unit.start + 1 : unit.stop]

    def flow_atoms(self, flow_node: str) -> tuple[str, ...]:
        """Atoms (topological order, retries included) inside a flow node's subtree."""
        unit = self._units[flow_node]
        return self._order[unit.start : unit.stop]

    def flow_nodes(self) -> tuple[str, ...]:
        """Start node names of every flow, outermost first."""
        return tuple(self._units)

    # -- scoping ------------------------------------------------------------

    def providers(self, atom_name: str, symbol: str) -> tuple[str, ...]:
        """Atoms that may provide ``symbol`` to ``atom_name``, best candidate first.

        Only symbols the atom consumes (execute or revert) are known; others
        give ``()``.  Raises AmbiguousDependency when the nearest providers
        have no order between them, KeyError for an unknown atom.
        """
        found = scopes.as_providers(self._providers[atom_name].get(symbol, ()))
        if (atom_name, symbol) in self._ambiguities:
            raise self._ambiguities[(atom_name, symbol)].error()
        return found

    def revert_providers(self, atom_name: str, symbol: str) -> tuple[str, ...]:
        """Same as :meth:`providers` for a symbol of the atom's ``revert``."""
        return self.providers(atom_name, symbol)

    def scope_for(self, atom_name: str) -> tuple[tuple[str, ...], ...]:
        """The atoms visible to ``atom_name``, level by level (TaskFlow's scope walk).

        Each level lists, nearest first, the atoms of one enclosing flow that
        run before ``atom_name``; the innermost flow comes first and trailing
        empty levels are dropped.  Computed on first use, then cached.
        """
        levels = self._scopes.get(atom_name)
        if levels is None:
            levels = scopes.walk_scopes(
                self._parents[atom_name], self._index[atom_name], self._order
            )
            self._scopes[atom_name] = levels
        return levels

    def ambiguities(self) -> tuple[Ambiguity, ...]:
        """Every ambiguous (atom, symbol) lookup, in topological order of the atoms.

        An engine should raise ``ambiguity.error()`` at validate time unless
        the symbol is supplied from outside (store / injection), which takes
        precedence over atom results.
        """
        return tuple(self._ambiguities.values())

    def unresolved(self, atom_name: str, method: str = "execute") -> frozenset[str]:
        """Required (non optional, non injected) symbols with no provider in scope.

        ``method`` is ``'execute'`` or ``'revert'``.  Such symbols must come
        from the store or injection, or the engine reports MissingDependencies.
        """
        return frozenset(
            spec.symbol
            for spec in self._plan(atom_name, method == "revert")
            if not spec.providers and not spec.optional and not self._injected(atom_name, spec)
        )

    def iter_unresolved(self) -> Iterator[tuple[str, str, frozenset[str]]]:
        """Yield ``(atom_name, method, symbols)`` for every atom method with unresolved needs."""
        for name in self._order:
            for method in ("execute", "revert"):
                missing = self.unresolved(name, method)
                if missing:
                    yield name, method, missing

    def argument_plan(self, atom_name: str) -> tuple[ArgSpec, ...]:
        """One ArgSpec per ``execute`` argument (rebind order); never raises on ambiguity."""
        return self._plan(atom_name, False)

    def revert_argument_plan(self, atom_name: str) -> tuple[ArgSpec, ...]:
        """One ArgSpec per ``revert`` argument (revert_rebind order)."""
        return self._plan(atom_name, True)

    def _injected(self, atom_name: str, spec: ArgSpec) -> bool:
        inject = self._atoms[atom_name].inject
        return bool(inject) and (spec.symbol in inject or spec.name in inject)

    def _plan(self, atom_name: str, revert: bool) -> tuple[ArgSpec, ...]:
        return tuple(ArgSpec._make(row) for row in self.plan_rows(atom_name, revert))

    def plan_rows(
        self, atom_name: str, revert: bool = False
    ) -> tuple[tuple[str, str, tuple[str, ...], bool], ...]:
        """:meth:`argument_plan` (or the revert one) as plain tuples: what the engine fetches by.

        Not cached: O(arguments) to build, needed about once per run of an
        atom, and a cache would hold two plans per atom for the whole run.
        """
        atom = self._atoms[atom_name]
        mapping = atom.revert_rebind if revert else atom.rebind
        if not mapping:
            return ()
        optional = atom.revert_optional if revert else atom.optional
        found = self._providers[atom_name]
        as_providers = scopes.as_providers
        return tuple(
            [
                (arg, symbol, as_providers(found.get(symbol, ())), symbol in optional)
                for arg, symbol in mapping.items()
            ]
        )


class PatternCompiler:
    """Compiles a flow pattern (or a single task) into a :class:`Compilation`.

    Raises TypeError for items that are neither tasks nor flows, ValueError
    for a flow nested inside itself (or twice), Duplicate for atom names used
    more than once and DependencyFailure for cycles between a flow's children.
    """

    def __init__(self, root: Any, freeze: bool = True) -> None:
        self._root = root
        self._freeze = freeze
        self._lock = threading.Lock()
        self._compilation: Compilation | None = None

    def compile(self) -> Compilation:
        """Compile once (later calls return the same Compilation)."""
        with self._lock:
            if self._compilation is None:
                # Building allocates many small containers and frees none of
                # them; a full collection pass over a big flow in the middle
                # can double compile time, so collection waits until the end
                # where the host allows it (the collector is the host's).
                with gc_freeze.collector_paused():
                    self._compilation = _Builder(self._root, self._freeze).build()
            return self._compilation


class _Builder:
    """One compilation run (internal)."""

    def __init__(self, root: Any, freeze: bool) -> None:
        self.root = root
        self.freeze = freeze
        self.atoms: dict[str, Any] = {}
        self.duplicates: list[str] = []
        self.parents: dict[str, scopes.Unit] = {}  # atom name -> containing unit
        self.index: dict[str, int] = {}  # atom name -> index in parent (-1: retry)
        self.units: list[scopes.Unit] = []
        self.seen_flows: set[int] = set()
        self.any_retry = False
        # What resolution needs of each atom, read as _walk meets it (the
        # atoms' topological order, see _order).
        self.facts = scopes.AtomFacts()

    # -- pass 1: the pattern tree -----------------------------------------

    def build(self) -> Compilation:
        root = self.root
        if not isinstance(root, flow_mod.Flow):
            if not isinstance(root, task_mod.BaseTask):
                raise TypeError(
                    f"Unknown object {root!r} ({type(root).__name__})"
                    f" requested to compile; expected a flow or a task"
                )
            from flowengine.patterns import linear_flow

            root = linear_flow.Flow(str(root.name)).add(root)
        root_unit = self._walk(root, None, 0)
        if self.duplicates:
            raise exc.Duplicate(f"Atoms with duplicate names found: {sorted(set(self.duplicates))}")
        self._name_flows()
        order = self._order(root_unit)
        topology, retries = self._topology(order)
        resolver = scopes.ProviderResolver(self.units, self.facts)
        providers, ambiguities, outside = resolver.resolve(order)
        for unit in self.units:
            unit.forget_resolution()
        units = {u.node: u for u in self.units}
        return Compilation(
            self.root,
            topology,
            retries,
            # Filled in the order _walk met the atoms: the topological order.
            self.atoms,
            order,
            self.parents,
            self.index,
            units,
            root_unit,
            providers,
            ambiguities,
            outside,
            self.freeze,
        )

    def _add_atom(self, atom: Any, unit: scopes.Unit, index: int) -> str:
        name = atom.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"Atom {atom!r} must have a non-empty string name")
        if name in self.atoms:
            self.duplicates.append(name)
        self.atoms[name] = atom
        self.parents[name] = unit
        self.index[name] = index
        self.facts.add(atom, unit, index)
        return name

    def _walk(self, flow: Any, parent: scopes.Unit | None, index: int) -> scopes.Unit:
        if id(flow) in self.seen_flows:
            raise ValueError(
                f"Flow '{flow.name}' appears more than once in the pattern"
                f" (nested in itself or added twice); this is not supported"
            )
        self.seen_flows.add(id(flow))
        unit = scopes.Unit(flow, parent, index)
        self.units.append(unit)
        if flow.retry is not None:
            self.any_retry = True
            if not isinstance(flow.retry, retry_mod.Retry):
                raise TypeError(
                    f"Retry controller {flow.retry!r} of flow '{flow.name}' is not a Retry"
                )
            unit.retry = self._add_atom(flow.retry, unit, -1)
        numbered = flow._numbered_links()
        if numbered is not None:
            items, numbered_links = numbered
            links: list[tuple[int, int, dict[str, Any] | None]] = list(numbered_links)
        else:
            items = [item for item, _meta in flow.iter_nodes()]
            links = self._links_by_position(flow, items)
        perm = self._toposort(flow, items, links)
        where = [0] * len(perm)
        for i, pos in enumerate(perm):
            where[pos] = i
        # Each item's first predecessor as a bare index, then a tuple grown
        # by copying (a list past _PREDS_COPIED): a list per item would be
        # one per atom alive at once, which the collector moves to its
        # oldest generation; half a graph flow's atoms have two or more
        # predecessors, enough to set off a full collection of a
        # 100,000-task flow here. Tuples of ints are untracked by the first
        # collection that sees them (issue 38).
        linked_from: list[int | tuple[int, ...] | list[int] | None] = [None] * len(items)
        for pu, pv, _meta in links:
            v, u = where[pv], where[pu]
            found = linked_from[v]
            if found is None:
                linked_from[v] = u
            elif isinstance(found, int):
                linked_from[v] = (found, u)
            elif isinstance(found, tuple):
                linked_from[v] = (*found, u) if len(found) < _PREDS_COPIED else [*found, u]
            else:
                found.append(u)
        # Tuples (most empty or of one index): less memory, and the
        # collector stops tracking tuples of ints.
        unit.preds = preds = [
            ()
            if p is None
            else (p,)
            if isinstance(p, int)
            else p
            if isinstance(p, tuple)
            else tuple(p)
            for p in linked_from
        ]
        unit.chain = len(items) > 1 and all(preds[i] == (i - 1,) for i in range(1, len(items)))
        unit.link_ends = array.array("q")
        for pu, pv, meta in links:
            kept = _kept(meta)
            if kept is not None:
                unit.link_meta[len(unit.link_ends) // 2] = kept
            unit.link_ends.extend((where[pu], where[pv]))
        for i, pos in enumerate(perm):
            item = items[pos]
            if isinstance(item, flow_mod.Flow):
                unit.kids.append(self._walk(item, unit, i))
            elif isinstance(item, task_mod.BaseTask):
                unit.kids.append(self._add_atom(item, unit, i))
            elif isinstance(item, retry_mod.Retry):
                raise TypeError(
                    f"Retry {item.name!r} was added to flow '{flow.name}' as an"
                    f" item; attach it with Flow(name, retry=...) instead"
                )
            else:
                raise TypeError(
                    f"Unknown object {item!r} ({type(item).__name__}) requested"
                    f" to compile in flow '{flow.name}'"
                )
        return unit

    @staticmethod
    def _links_by_position(flow: Any, items: list[Any]) -> list[tuple[int, int, Any]]:
        """The flow's links as ``(from, to, metadata)`` positions in ``items``."""
        position = {id(item): pos for pos, item in enumerate(items)}
        if len(position) != len(items):
            raise ValueError(f"Flow '{flow.name}' lists the same item twice")
        links: list[tuple[int, int, dict[str, Any] | None]] = []
        for u, v, meta in flow.iter_links_beyond_reasons():
            pu, pv = position.get(id(u)), position.get(id(v))
            if pu is None or pv is None:
                missing = u if pu is None else v
                raise exc.CompilationFailure(
                    f"Flow '{flow.name}' links {_label(missing)} which is not one of its items"
                )
            links.append((pu, pv, meta))
        return links

    @staticmethod
    def _toposort(flow: Any, items: list[Any], links: list[tuple[int, int, Any]]) -> list[int]:
        """Positions of ``items`` in a topological order (iteration order when it is one)."""
        if all(pu < pv for pu, pv, _ in links):
            return list(range(len(items)))
        succ: list[list[int]] = [[] for _ in items]
        indegree = [0] * len(items)
        for pu, pv, _ in links:
            succ[pu].append(pv)
            indegree[pv] += 1
        ready = deque(i for i, d in enumerate(indegree) if d == 0)
        out: list[int] = []
        while ready:
            i = ready.popleft()
            out.append(i)
            for j in succ[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    ready.append(j)
        if len(out) == len(items):
            return out
        # Walk backwards from a blocked item until a position repeats: a cycle.
        preds: dict[int, int] = {pv: pu for pu, pv, _ in links if indegree[pv] and indegree[pu]}
        node = next(iter(preds))
        path: list[int] = []
        while node not in path:
            path.append(node)
            node = preds[node]
        cycle = path[path.index(node) :][::-1]
        names = " -> ".join(_label(items[i]) for i in [*cycle, cycle[0]])
        raise exc.DependencyFailure(f"Flow '{flow.name}' has a dependency cycle: {names}")

    # -- pass 2: names, order and the execution graph ----------------------

    def _name_flows(self) -> None:
        taken = set(self.atoms)
        counter = 0
        for unit in self.units:
            while True:
                node = f"{unit.flow.name}[{counter}]"
                counter += 1
                end = node + "[end]"
                if node not in taken and end not in taken:
                    break
            taken.update((node, end))
            unit.node, unit.end = node, end

    def _order(self, root: scopes.Unit) -> tuple[str, ...]:
        """The atoms' topological order: each flow's retry, then its kids in order.

        That is also the order in which ``_walk`` adds the atoms (so the
        order of ``self.atoms`` and ``self.facts``).
        """
        order: list[str] = []

        def expand(unit: scopes.Unit) -> None:
            unit.start = len(order)
            if unit.retry is not None:
                order.append(unit.retry)
            for kid in unit.kids:
                if isinstance(kid, str):
                    order.append(kid)
                else:
                    expand(kid)
            unit.stop = len(order)

        expand(root)
        return tuple(order)

    def _topology(self, order: tuple[str, ...]) -> tuple[topo.Topology, dict[str, str]]:
        """The compact execution graph, and each atom's controlling retry (if any)."""
        nodes: list[str] = []
        kinds: dict[str, str] = {}
        for unit in self.units:
            nodes += (unit.node, unit.end)
            kinds[unit.node] = FLOW
            kinds[unit.end] = FLOW_END
        first_atom = len(nodes)
        nodes += order
        retries: dict[str, str] = {}
        index = self.index
        for name, i in zip(order, self.facts.index):
            kinds[name] = RETRY if i == -1 else TASK
        if self.any_retry:
            for name in order:
                # A retry is controlled by the retry of the flow enclosing its own.
                unit = self.parents[name]
                holder: scopes.Unit | None = unit.parent if index[name] == -1 else unit
                while holder is not None and holder.retry is None:
                    holder = holder.parent
                if holder is not None and holder.retry is not None:
                    retries[name] = holder.retry
        # Edges as two arrays of node numbers: no name looked up per edge.
        tails, heads = array.array("q"), array.array("q")
        deciders: dict[tuple[str, str], topo.Decision] = {}
        for u, v, _invariant, decider, depth in iter_edges(self.units, first_atom):
            tails.append(u)
            heads.append(v)
            if decider is not None:
                deciders[(nodes[u], nodes[v])] = topo.Decision(decider, depth)
        return topo.Topology(nodes, kinds, first_atom, tails, heads, deciders), retries


def iter_edges(
    units: list[scopes.Unit], first_atom: int
) -> Iterator[tuple[int, int, bool, Any, Any]]:
    """The execution graph's edges as node numbers, in the order they were always added.

    Yields ``(from, to, invariant, decider, decider_depth)``; the units are
    the compiled flows, outermost first. Unit i's start node is number 2i
    and its end 2i + 1; the atom at position p of the topological order
    (``Unit.start``/``stop`` slice it) is ``first_atom + p``.
    """
    number = {id(unit): 2 * i for i, unit in enumerate(units)}
    for unit in units:
        node = number[id(unit)]
        end = node + 1
        entry = node
        at = first_atom + unit.start
        if unit.retry is not None:
            yield node, at, True, None, None
            entry = at
            at += 1
        kids = unit.kids
        heads: list[int] = []
        tails: list[int] = []
        for kid in kids:
            if isinstance(kid, str):
                heads.append(at)
                tails.append(at)
                at += 1
            else:
                kid_node = number[id(kid)]
                heads.append(kid_node)
                tails.append(kid_node + 1)
                at = first_atom + kid.stop
        has_out = [False] * len(kids)
        ends = unit.link_ends
        metas = unit.link_meta
        for k in range(len(ends) // 2):
            a, b, meta = ends[2 * k], ends[2 * k + 1], metas.get(k)
            has_out[a] = True
            if meta:
                decider = meta.get(flow_mod.LINK_DECIDER)
                depth = meta.get(flow_mod.LINK_DECIDER_DEPTH)
                invariant = bool(meta.get(flow_mod.LINK_INVARIANT, False))
            else:
                decider = depth = None
                invariant = False
            if decider is not None:
                depth = Depth.translate(depth) if depth is not None else Depth.ALL
            else:
                depth = None
            yield tails[a], heads[b], invariant, decider, depth
        for i, head in enumerate(heads):
            if not unit.preds[i]:
                yield entry, head, True, None, None
            if not has_out[i]:
                yield tails[i], end, True, None, None
        if not kids:
            yield entry, end, True, None, None


def build_graph(compilation: Compilation, freeze: bool) -> graph_types.DiGraph:
    """The networkx execution graph of a compilation (see ``execution_graph``)."""
    # Imported here: the engine runs without networkx (importing it costs
    # ~0.1 s and ~20 MB), which only code asking for this graph needs.
    import networkx as nx

    from flowengine.types import graph as graph_types

    graph = graph_types.DiGraph()
    units = compilation.units_in_order()
    nodes: list[tuple[str, dict[str, Any]]] = []
    for unit in units:
        nodes.append((unit.node, {"kind": FLOW, "flow": unit.flow, "end": unit.end}))
        nodes.append((unit.end, {"kind": FLOW_END, "flow": unit.flow, "start": unit.node}))
    for name, atom in compilation.atoms.items():
        nodes.append(
            (
                name,
                {"kind": compilation.kind(name), "atom": atom, "retry": compilation.retry_of(name)},
            )
        )
    graph.add_nodes_from(nodes)
    topology = compilation.topology
    names = topology.order
    graph.add_edges_from(
        (names[u], names[v], {"invariant": invariant, "decider": decider, "decider_depth": depth})
        for u, v, invariant, decider, depth in iter_edges(units, topology.first_atom)
    )
    if freeze:
        nx.freeze(graph)
    return graph
