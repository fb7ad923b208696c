"""Scoping: which atoms an atom can see, and which of them provide its symbols.

TaskFlow's rule: an atom sees the atoms that run before it.  The nearest
enclosing flow is searched first, then its parent and so on; within one
flow level the latest provider comes first and a flow's retry controller
comes last (it runs before everything in its flow).  Two providers at the
nearest level with no order between them are ambiguous.

Ancestor questions are only asked between the children of one flow, only
for providers of symbols somebody consumes, and answered by a backward
search bounded by the children's topological positions; no all-pairs
closure is ever built.
"""

from __future__ import annotations

import array
import bisect
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from flowengine import exceptions as exc


class Ambiguity(NamedTuple):
    """An atom's symbol whose nearest providers have no order between them."""

    atom: str
    symbol: str
    providers: tuple[str, ...]

    def error(self) -> exc.AmbiguousDependency:
        """The AmbiguousDependency describing this ambiguity."""
        return exc.AmbiguousDependency(
            f"Atom '{self.atom}' requires symbol '{self.symbol}' which is provided"
            f" by {list(self.providers)} with no order between them; link them or"
            f" rename one of the outputs"
        )


class Unit:
    """Compile-time record of one flow: its children, links and provider tables."""

    __slots__ = (
        "flow",
        "parent",
        "index",
        "node",
        "end",
        "retry",
        "kids",
        "preds",
        "link_ends",
        "link_meta",
        "chain",
        "prov",
        "latest",
        "reach",
        "start",
        "stop",
    )

    def __init__(self, flow: Any, parent: Unit | None, index: int) -> None:
        self.flow = flow
        self.parent = parent
        self.index = index  # position among the parent's children
        self.node = ""  # execution graph start node name
        self.end = ""  # execution graph end node name
        self.retry: str | None = None
        self.kids: list[Any] = []  # atom names (str) or Unit, topological order
        self.preds: list[tuple[int, ...]] = []  # child index -> linked-from child indexes
        # Links between children, in the flow's order: link k goes from child
        # link_ends[2k] to child link_ends[2k + 1] (8 bytes an end, not a
        # tuple each); link_meta[k]: what the execution graph uses of its
        # metadata (deciders, invariant), for the few links that have any.
        self.link_ends = array.array("q")
        self.link_meta: dict[int, dict[str, Any]] = {}
        self.chain = False  # every child linked to the next (linear)
        self.prov: dict[str, ProviderEntries] = {}
        self.latest: dict[str, tuple[str, ...]] = {}
        self.reach: dict[tuple[int, int], bool] = {}
        self.start = 0  # slice of Compilation.topological_order
        self.stop = 0

    def forget_resolution(self) -> None:
        """Drop the provider tables only provider resolution needs (it is done)."""
        self.prov = {}
        self.latest = {}


def precedes(unit: Unit, a: int, b: int) -> bool:
    """True if child ``a`` of ``unit`` runs before child ``b`` (a == -1: the retry)."""
    if a == -1:
        return True
    if a >= b:
        return False
    if unit.chain:
        return True
    preds = unit.preds
    if not preds[b]:
        return False
    if a in preds[b]:
        return True
    key = (a, b)
    known = unit.reach.get(key)
    if known is None:
        # Backward search from b; children before a can not lead to a.
        seen = {b}
        stack = [b]
        known = False
        while stack and not known:
            for p in preds[stack.pop()]:
                if p == a:
                    known = True
                    break
                if p > a and p not in seen:
                    seen.add(p)
                    stack.append(p)
        unit.reach[key] = known
    return known


def _neg_ci(entry: tuple[int, str]) -> int:
    return -entry[0]


def walk_scopes(unit: Unit | None, b: int, order: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Visible atoms per level for the item at child index ``b`` of ``unit`` (-1: its retry).

    Each level lists, nearest first, the atoms of one enclosing flow that run
    before the item; the innermost flow comes first and trailing empty levels
    are dropped (TaskFlow's scope walk).
    """
    if b == -1 and unit is not None:
        # A retry sees nothing of its own flow: start one level up.
        b = unit.index
        unit = unit.parent
    levels: list[tuple[str, ...]] = []
    while unit is not None:
        level: list[str] = []
        for ci in range(b - 1, -1, -1):
            if precedes(unit, ci, b):
                kid = unit.kids[ci]
                if isinstance(kid, str):
                    level.append(kid)
                else:
                    level.extend(reversed(order[kid.start : kid.stop]))
        if unit.retry is not None:
            level.append(unit.retry)
        levels.append(tuple(level))
        b = unit.index
        unit = unit.parent
    while levels and not levels[-1]:
        levels.pop()
    return tuple(levels)


#: An atom's providers per symbol it consumes, nearest first: the one
#: provider's name itself when there is one (the usual case), else a tuple.
#: A dict holding only strings is one the garbage collector stops tracking;
#: one holding a fresh tuple is walked by every full collection until one
#: untracks it, one such dict per atom of the flow.
ProviderTable = dict[str, "str | tuple[str, ...]"]


def as_providers(found: str | tuple[str, ...]) -> tuple[str, ...]:
    """A ProviderTable value as a tuple of providers."""
    return (found,) if isinstance(found, str) else found


#: A unit's providers of one symbol, (child index, provider) from the last
#: child to the first: a tuple while there is one (most symbols have one
#: provider; a tuple of ints and strings is untracked by the collector,
#: where a list per symbol was an object per atom that it moved to its
#: oldest generation and walked), a list from the second.
ProviderEntries = tuple[tuple[int, str], ...] | list[tuple[int, str]]


def _add_entry(prov: dict[str, ProviderEntries], symbol: str, entry: tuple[int, str]) -> None:
    found = prov.get(symbol)
    if found is None:
        prov[symbol] = (entry,)
    elif isinstance(found, tuple):
        prov[symbol] = [*found, entry]
    else:
        found.append(entry)


class AtomFacts:
    """What provider resolution needs of every atom, gathered in one read of each.

    The compiler fills it as it meets the atoms, which is their topological
    order, so entry ``p`` of each list is the atom at position ``p`` of
    ``Compilation.topological_order``.  Resolution then reads these flat
    lists instead of going over the atom objects three more times (the
    symbols consumed, the providers, each atom's lookups): at 100,000 atoms
    those objects are spread over a few hundred megabytes, each pass
    reading them out of the caches (issue 38).
    """

    __slots__ = ("needed", "units", "index", "consumes", "also_consumes", "offers", "injected")

    def __init__(self) -> None:
        #: Every symbol some atom consumes (execute or revert).
        self.needed: set[str] = set()
        self.units: list[Unit] = []  # the unit holding the atom
        self.index: list[int] = []  # its child index there (-1: the unit's retry)
        #: Its execute mapping (argument -> symbol; the atom's own dict, not
        #: a copy: a container made per atom is one more the collector counts).
        self.consumes: list[dict[str, str]] = []
        #: Position -> what its revert consumes beyond that (the few whose
        #: revert mapping is not execute's).
        self.also_consumes: dict[int, tuple[str, ...]] = {}
        self.offers: list[Any] = []  # what it provides (the atom's own set)
        #: Position -> symbols its own injected values cover (the few that inject).
        self.injected: dict[int, set[str]] = {}

    def add(self, atom: Any, unit: Unit, index: int) -> None:
        """Record the next atom in topological order."""
        rebind = atom.rebind
        revert = atom.revert_rebind
        if rebind:
            self.needed.update(rebind.values())
        position = len(self.consumes)
        if revert and revert is not rebind:
            self.needed.update(revert.values())
            self.also_consumes[position] = tuple(revert.values())
        inject = atom.inject
        if inject:
            # Atom-local injected values win over any provider.
            injected = set(inject)
            for mapping in (rebind, revert):
                injected.update(mapping[a] for a in inject if a in mapping)
            self.injected[position] = injected
        self.units.append(unit)
        self.index.append(index)
        self.consumes.append(rebind)
        self.offers.append(atom.provides)


class ProviderResolver:
    """Computes, for every atom and consumed symbol, its providers nearest first."""

    def __init__(self, units: list[Unit], facts: AtomFacts) -> None:
        self._units = units  # outermost first
        self._facts = facts
        self._collect_providers()

    def _collect_providers(self) -> None:
        """Fill each unit's ``prov``: symbol -> [(child index, provider)], last child first."""
        needed = self._facts.needed
        offers = self._facts.offers
        # Children before parents: a unit's table is built from its kids'.
        for unit in reversed(self._units):
            prov: dict[str, ProviderEntries] = {}
            # The position (in topological order) of the kid being read:
            # the unit's atoms and subflows fill its slice in kid order.
            at = unit.stop
            for ci in range(len(unit.kids) - 1, -1, -1):
                kid = unit.kids[ci]
                if isinstance(kid, str):
                    at -= 1
                    for symbol in offers[at]:
                        if symbol in needed:
                            _add_entry(prov, symbol, (ci, kid))
                else:
                    at = kid.start
                    for symbol, entries in kid.prov.items():
                        for _c, name in entries:
                            _add_entry(prov, symbol, (ci, name))
            if unit.retry is not None:
                for symbol in offers[unit.start]:
                    if symbol in needed:
                        _add_entry(prov, symbol, (-1, unit.retry))
            unit.prov = prov

    def _latest(self, unit: Unit, symbol: str) -> tuple[str, ...]:
        """The last providers of ``symbol`` inside ``unit`` (several: ambiguous)."""
        cached = unit.latest.get(symbol)
        if cached is not None:
            return cached
        entries = unit.prov.get(symbol, ())
        kids = [ci for ci, _name in entries if ci != -1]
        if not kids:
            result: tuple[str, ...] = tuple(name for ci, name in entries if ci == -1)
        else:
            first = kids[0]
            result = self._kid_latest(unit, first, symbol)
            done = {first}
            for ci in kids:
                if ci not in done:
                    done.add(ci)
                    if not precedes(unit, ci, first):
                        result += self._kid_latest(unit, ci, symbol)
        unit.latest[symbol] = result
        return result

    def _kid_latest(self, unit: Unit, ci: int, symbol: str) -> tuple[str, ...]:
        kid = unit.kids[ci]
        return (kid,) if isinstance(kid, str) else self._latest(kid, symbol)

    def _lookup(self, owner: Unit, b: int, symbol: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(providers nearest first, competing nearest providers if ambiguous else ())
        of ``symbol`` for child ``b`` of ``owner`` (-1: its retry)."""
        unit: Unit | None = owner
        if b == -1:
            # A retry sees nothing of its own flow: start one level up.
            b = owner.index
            unit = owner.parent
        found: list[str] = []
        clash: tuple[str, ...] = ()
        first_level = True
        while unit is not None:
            entries = unit.prov.get(symbol)
            if entries and len(entries) == 1:
                # One provider in this flow and its subflows (the usual
                # case): in scope if it runs before child b, and alone it
                # cannot clash.
                ((ci, name),) = entries
                if precedes(unit, ci, b):
                    first_level = False
                    found.append(name)
            elif entries:
                # Entries run from the last child to the first (retry last), so
                # those before child b are a suffix.
                start = bisect.bisect_right(entries, -b, key=_neg_ci)
                if unit.chain:
                    level = entries[start:]
                elif not unit.preds[b]:
                    level = [e for e in entries[start:] if e[0] == -1]
                else:
                    level = [e for e in entries[start:] if precedes(unit, e[0], b)]
                if level:
                    if first_level:
                        clash = self._level_clash(unit, level, symbol)
                        first_level = False
                    found.extend([n for _ci, n in level])
            b = unit.index
            unit = unit.parent
        return tuple(found), clash

    def _level_clash(
        self, unit: Unit, level: Sequence[tuple[int, str]], symbol: str
    ) -> tuple[str, ...]:
        first = level[0][0]
        if first == -1:
            return ()
        winners = self._kid_latest(unit, first, symbol)
        if unit.chain:
            # Every earlier child runs before ``first``: only it can clash inside.
            return winners if len(winners) > 1 else ()
        done = {first, -1}
        for ci, _n in level:
            if ci not in done:
                done.add(ci)
                if not precedes(unit, ci, first):
                    winners += self._kid_latest(unit, ci, symbol)
        return winners if len(winners) > 1 else ()

    def resolve(
        self, order: tuple[str, ...]
    ) -> tuple[dict[str, ProviderTable], dict[tuple[str, str], Ambiguity], tuple[str, ...]]:
        """Per atom: symbol -> providers nearest first (see ProviderTable); the
        ambiguities; and the atoms with some symbol nobody in scope provides
        (in ``order``)."""
        providers: dict[str, ProviderTable] = {}
        ambiguities: dict[tuple[str, str], Ambiguity] = {}
        outside: list[str] = []
        facts = self._facts
        injected = facts.injected
        also_consumes = facts.also_consumes
        lookup = self._lookup
        for p, (name, rebind, unit, b) in enumerate(
            zip(order, facts.consumes, facts.units, facts.index)
        ):
            table: ProviderTable = {}
            consumes: Iterable[str] = rebind.values()
            if also_consumes and p in also_consumes:
                consumes = (*consumes, *also_consumes[p])
            for symbol in consumes:
                if symbol in table:
                    continue
                found, clash = lookup(unit, b, symbol)
                table[symbol] = found[0] if len(found) == 1 else found
                if not found and (not outside or outside[-1] != name):
                    outside.append(name)
                if clash and symbol not in injected.get(p, ()):
                    ambiguities[(name, symbol)] = Ambiguity(name, symbol, clash)
            providers[name] = table
        return providers, ambiguities, tuple(outside)
