"""The abstract flow: a named, structured collection of atoms and subflows."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from flowengine import atom
from flowengine.utils import reflection

if TYPE_CHECKING:
    from flowengine.retry import Retry

#: What a flow holds: atoms (tasks, retries) and other flows.
Item: TypeAlias = "atom.Atom | Flow"

# Keys with a special meaning in link metadata (the dicts iter_links yields).
#: The link only preserves an ordering the pattern itself imposes.
LINK_INVARIANT = "invariant"
#: The link was made explicitly by the user (graph flow ``link``).
LINK_MANUAL = "manual"
#: The link was made by the compiler to place a retry controller.
LINK_RETRY = "retry"
#: The link was inferred from symbols; the value is the set of those symbols.
LINK_REASONS = "reasons"
#: A callable ``decider(history) -> bool`` deciding at run time whether the
#: target of the link runs.
LINK_DECIDER = "decider"
#: How far a negative decision reaches (a ``deciders.Depth``; default ALL).
LINK_DECIDER_DEPTH = "decider_depth"

# Built-in patterns print without their package prefix, as TaskFlow's do.
_CHOP_PREFIX = "flowengine.patterns."


def check_item(flow: Flow, item: object) -> None:
    """Raise TypeError unless ``item`` may be added to ``flow`` (an atom or another flow)."""
    if item is flow:
        raise ValueError(f"Flow {flow} can not be added to itself")
    if not isinstance(item, (Flow, atom.Atom)):
        raise TypeError(
            f"Flow '{flow.name}' can only contain atoms and flows,"
            f" not {item!r} ({type(item).__name__})"
        )


class Flow(abc.ABC):
    """Base class of every flow pattern: a named container of atoms and subflows.

    How the children depend on each other is up to each pattern; this class
    gives the common interface (``add``, iteration, ``iter_nodes``,
    ``iter_links``, ``requires``, ``provides``) the compiler relies on.
    """

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        self._name = str(name)
        self._retry = retry
        # An unnamed retry controller takes its name from the flow it controls.
        if retry is not None and getattr(retry, "name", None) is None:
            retry.name = self._name + "_retry"

    @property
    def name(self) -> str:
        """A human readable name (not necessarily unique)."""
        return self._name

    @property
    def retry(self) -> Retry | None:
        """The retry controller of this flow, or None."""
        return self._retry

    @abc.abstractmethod
    def add(self, *items: Item) -> Flow:
        """Add atoms and/or flows to this flow; returns the flow itself."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """How many direct children the flow has."""

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Item]:
        """Iterate over the direct children (atoms and subflows)."""

    @abc.abstractmethod
    def iter_nodes(self) -> Iterator[tuple[Item, dict[str, Any]]]:
        """Iterate over ``(child, metadata)`` pairs."""

    @abc.abstractmethod
    def iter_links(self) -> Iterator[tuple[Item, Item, dict[str, Any]]]:
        """Iterate over ``(u, v, metadata)`` links: ``v`` runs after ``u``."""

    def iter_links_beyond_reasons(self) -> Iterator[tuple[Item, Item, dict[str, Any] | None]]:
        """:meth:`iter_links`, with None as the metadata of links that hold only reasons.

        For the engine's compiler, which keeps no reasons: a pattern storing
        such links compactly (graph flows) need not make a dict per link.
        """
        return iter(self.iter_links())

    def _numbered_links(
        self,
    ) -> tuple[list[Item], Iterator[tuple[int, int, dict[str, Any] | None]]] | None:
        """Children and links by position, for the engine's compiler (internal).

        The children as :meth:`iter_nodes` lists them, and
        :meth:`iter_links_beyond_reasons` as ``(u, v, metadata)`` positions
        in that list; None where the pattern has no cheaper way than the
        compiler looking each link's ends up itself (issue 38).
        """
        return None

    @property
    def provides(self) -> frozenset[str]:
        """Every symbol some child (or the retry) of this flow produces."""
        provided: set[str] = set()
        if self._retry is not None:
            provided.update(self._retry.provides)
        for item in self:
            provided.update(item.provides)
        return frozenset(provided)

    @property
    @abc.abstractmethod
    def requires(self) -> frozenset[str]:
        """The symbols this flow needs from outside (not produced inside it)."""

    def __str__(self) -> str:
        cls_name = reflection.get_class_name(self)
        if cls_name.startswith(_CHOP_PREFIX):
            cls_name = cls_name[len(_CHOP_PREFIX) :]
        # Quoted, as TaskFlow 6.5 prints flows (code may compare the text).
        return f'"{cls_name}: {self.name}(len={len(self)})"'


class ItemListFlow(Flow):
    """A flow whose children are kept in insertion order (linear and unordered)."""

    def __init__(self, name: str, retry: Retry | None = None) -> None:
        super().__init__(name, retry)
        # dict used as an ordered set: O(1) membership, insertion order kept.
        self._items: dict[Item, None] = {}

    def add(self, *items: Item) -> ItemListFlow:
        """Append items; an item already in this flow is ignored (as TaskFlow does)."""
        for item in items:
            check_item(self, item)
        for item in items:
            self._items.setdefault(item, None)
        return self

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    def iter_nodes(self) -> Iterator[tuple[Item, dict[str, Any]]]:
        for item in self._items:
            yield item, {}
