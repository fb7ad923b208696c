"""Graph flow: children run in the order their data dependencies and links impose."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, TypeAlias

from flowengine import exceptions as exc
from flowengine import flow
from flowengine.deciders import Depth
from flowengine.patterns._dag import REASONS, CycleError, OrderedDAG
from flowengine.utils import gc_freeze

if TYPE_CHECKING:
    from flowengine.retry import Retry

assert REASONS == flow.LINK_REASONS  # the graph expands compact edges with this key

#: ``decider(history) -> bool``: ``history`` maps each deciding predecessor's
#: name to its result.
Decider: TypeAlias = Callable[[dict[str, Any]], bool]


def _names(nodes: Iterable[object]) -> list[str]:
    return [getattr(n, "name", str(n)) for n in nodes]


def _cycle_failure(err: CycleError, u: flow.Item, v: flow.Item) -> exc.DependencyFailure:
    names = " -> ".join(_names(err.cycle))
    # "No path through ..." first: TaskFlow's message starts so, and code
    # written for it matches on that.
    return exc.DependencyFailure(
        f"No path through the items of the graph produces an ordering that will allow"
        f" for logical edge traversal: linking '{getattr(u, 'name', u)}' ->"
        f" '{getattr(v, 'name', v)}' would create a cycle: {names}"
    )


#: symbol -> the one atom providing (requiring) it, or a list when several
#: do. Most symbols have one: a list each would cost ~90 bytes per atom.
_AtomIndex: TypeAlias = dict[str, "flow.Item | list[flow.Item]"]


def _index_add(index: _AtomIndex, symbol: str, node: flow.Item) -> None:
    found = index.get(symbol)
    if found is None:
        index[symbol] = node
    elif isinstance(found, list):
        found.append(node)
    else:
        index[symbol] = [found, node]


def _index_get(index: _AtomIndex, symbol: str) -> list[flow.Item]:
    """A new list of the atoms indexed under ``symbol`` (in the order added)."""
    found = index.get(symbol)
    if found is None:
        return []
    return list(found) if isinstance(found, list) else [found]


def _index_remove(index: _AtomIndex, symbol: str, node: flow.Item) -> None:
    found = index.get(symbol)
    if isinstance(found, list):
        if node in found:
            found.remove(node)
            if len(found) == 1:
                index[symbol] = found[0]
    elif found is not None and found == node:
        del index[symbol]


class Flow(flow.Flow):
    """Runs children as soon as what they depend on has run.

    An edge ``A -> B`` means ``B`` runs after ``A`` (and is reverted before
    it).  Edges come from symbols (a child requiring what another provides)
    and from explicit :meth:`link` calls.  Cycles are refused when they are
    made: :class:`~flowengine.exceptions.DependencyFailure` names the items on
    the cycle and the flow is left unchanged.
    """

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        super().__init__(name, retry)
        self._graph: OrderedDAG[flow.Item] = OrderedDAG()
        # symbol -> atoms providing / requiring it (atoms never change those;
        # subflows can, so they are asked again each time).
        self._atom_providers: _AtomIndex = {}
        self._atom_requirers: _AtomIndex = {}
        self._subflows: dict[flow.Flow, None] = {}

    # -- building ---------------------------------------------------------

    def _index(self, node: flow.Item) -> None:
        if isinstance(node, flow.Flow):
            self._subflows[node] = None
            return
        for symbol in node.provides:
            _index_add(self._atom_providers, symbol, node)
        for symbol in node.requires:
            _index_add(self._atom_requirers, symbol, node)

    def _unindex(self, node: flow.Item) -> None:
        if isinstance(node, flow.Flow):
            self._subflows.pop(node, None)
            return
        for index, symbols in (
            (self._atom_providers, node.provides),
            (self._atom_requirers, node.requires),
        ):
            for symbol in symbols:
                _index_remove(index, symbol, node)

    def _retry_provides(self) -> frozenset[str]:
        if self._retry is None:
            return frozenset()
        return frozenset(self._retry.provides)

    def _is_satisfied(
        self,
        graph: OrderedDAG[flow.Item],
        node: flow.Item,
        symbol: str,
        provides_of: Callable[[flow.Item], AbstractSet[str]],
    ) -> bool:
        """True if some ancestor of ``node`` in ``graph`` provides ``symbol``."""
        return graph.find_ancestor(node, lambda a: symbol in provides_of(a))

    def add(
        self, *nodes: flow.Item, resolve_requires: bool = True, resolve_existing: bool = True
    ) -> Flow:
        """Add atoms/flows and link them to providers and requirers already present.

        ``resolve_requires``: link each new item to the existing provider of
        each symbol it requires (several providers raise
        :class:`~flowengine.exceptions.AmbiguousDependency`).
        ``resolve_existing``: link each new item to existing items that
        require, and do not yet get, a symbol it provides.  On any error the
        flow is left as it was.
        """
        # Adding makes only the graph's long-lived edges and indexes; with
        # thousands of items the collector's passes over them cost a third
        # of the add (see utils.gc_freeze).
        with gc_freeze.collector_paused():
            return self._add(nodes, resolve_requires, resolve_existing)

    def _add(
        self, nodes: tuple[flow.Item, ...], resolve_requires: bool, resolve_existing: bool
    ) -> Flow:
        graph = self._graph
        new: list[flow.Item] = []
        seen: set[int] = set()
        for node in nodes:
            flow.check_item(self, node)
            if node not in graph and id(node) not in seen:
                seen.add(id(node))
                new.append(node)
        if not new:
            return self
        retry_provides = self._retry_provides()
        # Subflow provides/requires are recomputed on access; ask once per add.
        flow_provides: dict[flow.Item, frozenset[str]] = {}
        flow_requires: dict[flow.Item, frozenset[str]] = {}

        def provides_of(item: flow.Item) -> AbstractSet[str]:
            if isinstance(item, flow.Flow):
                if item not in flow_provides:
                    flow_provides[item] = item.provides
                return flow_provides[item]
            return item.provides

        def requires_of(item: flow.Item) -> AbstractSet[str]:
            if isinstance(item, flow.Flow):
                if item not in flow_requires:
                    flow_requires[item] = item.requires
                return flow_requires[item]
            return item.requires

        # Both hold a value per symbol of every new item, all alive until the
        # add ends: kept small (a lone provider as itself, no requirers as the
        # shared empty tuple) so that adding n atoms does not leave n lists
        # for the collector to carry into its oldest generation (issue 38).
        added_providers: _AtomIndex = {}
        pending_requirers: dict[str, list[flow.Item] | tuple[()]] = {}

        # Flows of atoms only (the large ones) skip the subflow scans below.
        subflows = self._subflows

        def providers_for(symbol: str) -> list[flow.Item]:
            found = _index_get(self._atom_providers, symbol)
            if subflows:
                found.extend(f for f in subflows if symbol in provides_of(f))
            found.extend(_index_get(added_providers, symbol))
            return found

        def requirers_for(symbol: str) -> list[flow.Item] | tuple[()]:
            # Existing items still lacking ``symbol`` (computed on first use).
            pending = pending_requirers.get(symbol)
            if pending is None:
                candidates = _index_get(self._atom_requirers, symbol)
                if subflows:
                    candidates.extend(f for f in subflows if symbol in requires_of(f))
                lacking = [
                    c
                    for c in candidates
                    if c in graph and not self._is_satisfied(graph, c, symbol, provides_of)
                ]
                pending = pending_requirers[symbol] = lacking or ()
            return pending

        added: list[flow.Item] = []
        try:
            for node in new:
                # Existing requirers are computed before the node joins the graph.
                node_provides = list(provides_of(node))
                if resolve_existing:
                    for symbol in node_provides:
                        requirers_for(symbol)
                graph.add_node(node)
                added.append(node)
                if resolve_requires:
                    for symbol in requires_of(node):
                        if symbol in retry_provides:
                            continue
                        providers = providers_for(symbol)
                        if len(providers) > 1:
                            raise exc.AmbiguousDependency(
                                f"Resolution error detected when adding '{node.name}',"
                                f" multiple providers {sorted(_names(providers))}"
                                f" found for required symbol '{symbol}'"
                            )
                        if providers:
                            self._link(providers[0], node, reason=symbol)
                        else:
                            lacking = requirers_for(symbol)
                            if isinstance(lacking, list):
                                lacking.append(node)
                            else:
                                pending_requirers[symbol] = [node]
                for symbol in node_provides:
                    _index_add(added_providers, symbol, node)
                if resolve_existing:
                    for symbol in node_provides:
                        waiting = requirers_for(symbol)
                        if not isinstance(waiting, list):
                            continue
                        for requiree in list(waiting):
                            if requiree is not node:
                                self._link(node, requiree, reason=symbol)
                                waiting.remove(requiree)
        except Exception:
            for node in added:
                graph.remove_node(node)
            raise
        for node in added:
            self._index(node)
        self._changed()
        return self

    def _link(
        self,
        u: flow.Item,
        v: flow.Item,
        reason: str | None = None,
        manual: bool = False,
        decider: Decider | None = None,
        decider_depth: Depth | None = None,
    ) -> None:
        if reason is not None and not manual and decider is None and decider_depth is None:
            # The common case (a link made for a symbol): the graph keeps it compactly.
            try:
                self._graph.add_reason_edge(u, v, reason)
            except CycleError as err:
                raise _cycle_failure(err, u, v) from None
            return
        data = self._graph.edge_data(u, v)
        update: dict[str, Any] = {}
        if decider is not None:
            update[flow.LINK_DECIDER] = decider
        if decider_depth is not None:
            update[flow.LINK_DECIDER_DEPTH] = decider_depth
        if manual:
            update[flow.LINK_MANUAL] = True
        if reason is not None:
            reasons = set(data.get(flow.LINK_REASONS, ())) if data else set()
            reasons.add(reason)
            update[flow.LINK_REASONS] = reasons
        try:
            self._graph.add_edge(u, v, update)
        except CycleError as err:
            raise _cycle_failure(err, u, v) from None
        linked = self._graph.edge_data(u, v)  # never None: the edge was just added
        if decider is not None and decider_depth is None and linked is not None:
            # A new decider replaces the old one together with its depth.
            linked.pop(flow.LINK_DECIDER_DEPTH, None)

    def link(
        self,
        u: flow.Item,
        v: flow.Item,
        decider: Decider | None = None,
        decider_depth: Depth | str | None = None,
    ) -> Flow:
        """Make existing item ``v`` run after existing item ``u``.

        ``decider(history) -> bool`` decides at run time whether ``v`` runs
        (``history`` maps each deciding predecessor's name to its result);
        ``decider_depth`` (a :class:`~flowengine.deciders.Depth` or its name,
        default ALL) says how much of what follows is skipped when it says no.
        Raises ValueError for unknown items or a bad decider/depth and
        DependencyFailure (flow unchanged) if the link closes a cycle.
        """
        if u not in self._graph:
            raise ValueError(f"Node '{u}' not found to link from")
        if v not in self._graph:
            raise ValueError(f"Node '{v}' not found to link to")
        if decider is not None and not callable(decider):
            raise ValueError("Decider boolean callback must be callable")
        if decider_depth is not None:
            if decider is None:
                raise ValueError("Decider depth requires a decider to be provided along with it")
            depth: Depth | None = Depth.translate(decider_depth)
        else:
            depth = None
        self._link(u, v, manual=True, decider=decider, decider_depth=depth)
        self._changed()
        return self

    def unlink(self, u: flow.Item, v: flow.Item) -> Flow:
        """Remove the link ``u -> v`` (ValueError if there is none)."""
        if not self._graph.has_edge(u, v):
            raise ValueError(f"No link from '{u}' to '{v}'")
        self._graph.remove_edge(u, v)
        self._changed()
        return self

    def _changed(self) -> None:
        """Hook for subclasses caching views of the graph."""

    # -- reading ----------------------------------------------------------

    def _view(self) -> OrderedDAG[flow.Item]:
        """The part of the graph this flow exposes (all of it here)."""
        return self._graph

    def __len__(self) -> int:
        return len(self._view())

    def __iter__(self) -> Iterator[flow.Item]:
        return iter(self._view().topological())

    def iter_nodes(self) -> Iterator[tuple[flow.Item, dict[str, Any]]]:
        """Children in a topological order, each with empty metadata."""
        for node in self._view().topological():
            yield node, {}

    def iter_links(self) -> Iterator[tuple[flow.Item, flow.Item, dict[str, Any]]]:
        """Links as (u, v, metadata) with LINK_REASONS / LINK_MANUAL / LINK_DECIDER keys."""
        return self._view().edges()

    def iter_links_beyond_reasons(
        self,
    ) -> Iterator[tuple[flow.Item, flow.Item, dict[str, Any] | None]]:
        """:meth:`iter_links`, None for links made for one symbol (see flow.Flow)."""
        return self._view().edges_beyond_reasons()

    def _numbered_links(
        self,
    ) -> tuple[list[flow.Item], Iterator[tuple[int, int, dict[str, Any] | None]]] | None:
        """See :meth:`flowengine.flow.Flow._numbered_links` (the graph keeps numbers)."""
        cls = type(self)
        if (
            cls.iter_nodes is not Flow.iter_nodes
            or cls.iter_links_beyond_reasons is not Flow.iter_links_beyond_reasons
        ):
            return None  # a subclass lists its children or links its own way
        return self._view().numbered()

    @property
    def graph(self) -> OrderedDAG[flow.Item]:
        """The underlying dependency graph (read only, please)."""
        return self._view()

    @property
    def requires(self) -> frozenset[str]:
        """Symbols some child needs that neither an ancestor nor the retry provides."""
        graph = self._view()
        retry_provides = self._retry_provides()
        required: set[str] = set()
        if self._retry is not None:
            required.update(self._retry.requires)
        provides: dict[flow.Item, frozenset[str]] = {
            n: frozenset(n.provides) for n in graph.nodes()
        }
        providers: dict[str, int] = {}
        for symbols in provides.values():
            for symbol in symbols:
                providers[symbol] = providers.get(symbol, 0) + 1
        for node in graph.nodes():
            for symbol in node.requires:
                if symbol in retry_provides or symbol in required:
                    continue
                if not providers.get(symbol):
                    required.add(symbol)
                elif not any(
                    symbol in provides[p] for p in graph.predecessors(node)
                ) and not graph.find_ancestor(node, lambda a, s=symbol: s in provides[a]):
                    required.add(symbol)
        return frozenset(required)


class TargetedFlow(Flow):
    """A graph flow that can be limited to one target and what it depends on."""

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        super().__init__(name, retry)
        self._target: flow.Item | None = None
        self._subgraph: OrderedDAG[flow.Item] | None = None

    def set_target(self, target_node: flow.Item) -> None:
        """Only run ``target_node`` and the items it (transitively) depends on."""
        if target_node not in self._graph:
            raise ValueError(f"Node '{target_node}' not found")
        self._target = target_node
        self._subgraph = None

    def reset_target(self) -> None:
        """Run every item again."""
        self._target = None
        self._subgraph = None

    def _changed(self) -> None:
        self._subgraph = None

    def _view(self) -> OrderedDAG[flow.Item]:
        if self._target is None:
            return self._graph
        if self._subgraph is None:
            keep = self._graph.ancestors(self._target)
            keep.add(self._target)
            sub: OrderedDAG[flow.Item] = OrderedDAG()
            for node in self._graph.topological():
                if node in keep:
                    sub.add_node(node)
            for u, v, data in self._graph.edges():
                if u in keep and v in keep:
                    sub.add_edge(u, v, data)
            self._subgraph = sub
        return self._subgraph
