"""A small n-ary tree, as TaskFlow exposes it (``engine.compilation.hierarchy``'s type).

Each :class:`Node` holds an ``item`` and ``metadata`` and knows its parent;
it can be searched, walked depth or breadth first, drawn as text, turned into
a :class:`~flowengine.types.graph.DiGraph`, and frozen.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from flowengine.types import graph as graph_types

__all__ = ["FrozenNode", "Node"]

#: Branch drawn before a child, and what continues below a child that is
#: not its parent's last (a last child's subtree is indented with blanks).
_BRANCH = "|__"
_CONTINUED = "|  "
_LAST = "   "


class FrozenNode(Exception):
    """A frozen node (or tree) was asked to change."""


class Node:
    """One node of a tree: an item, metadata, a parent and ordered children."""

    def __init__(self, item: Any, **metadata: Any) -> None:
        self.item = item
        self.metadata = dict(metadata)
        self.parent: Node | None = None
        self.frozen = False
        self._children: list[Node] = []

    # -- changing it ---------------------------------------------------------

    def _check_unfrozen(self) -> None:
        if self.frozen:
            raise FrozenNode(f"Frozen node {self.item!r} can not be changed")

    def add(self, child: Node) -> None:
        """Append ``child`` (its parent becomes this node)."""
        self._check_unfrozen()
        child.parent = self
        self._children.append(child)

    def freeze(self) -> Node:
        """Freeze this node and everything below it; returns it."""
        for node in self.dfs_iter(include_self=True):
            node.frozen = True
        return self

    def disassociate(self) -> int:
        """Detach this node from its parent; how many times the parent held it."""
        self._check_unfrozen()
        parent, self.parent = self.parent, None
        if parent is None:
            return 0
        parent._check_unfrozen()
        before = len(parent._children)
        parent._children = [c for c in parent._children if c is not self]
        return before - len(parent._children)

    def remove(self, item: Any, only_direct: bool = False, include_self: bool = True) -> Node:
        """Detach the node holding ``item`` and return it; ValueError if there is none."""
        self._check_unfrozen()
        node = self.find(item, only_direct=only_direct, include_self=include_self)
        if node is None:
            raise ValueError(f"Item {item!r} not found to remove")
        node.disassociate()
        return node

    # -- looking at it -------------------------------------------------------

    def __getitem__(self, index: int) -> Node:
        return self._children[index]

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._children)

    def __contains__(self, item: Any) -> bool:
        return self.find(item) is not None

    def __repr__(self) -> str:
        return f"Node({self.item!r}, children={len(self._children)})"

    def empty(self) -> bool:
        """Whether this node has no children."""
        return not self._children

    def child_count(self, only_direct: bool = True) -> int:
        """How many children (``only_direct=False``: descendants) this node has."""
        if only_direct:
            return len(self._children)
        return sum(1 for _ in self.dfs_iter())

    def index(self, item: Any) -> int:
        """Position of the direct child holding ``item``; ValueError if none does."""
        for i, child in enumerate(self._children):
            if child.item == item:
                return i
        raise ValueError(f"Item {item!r} not a direct child of {self.item!r}")

    def find(self, item: Any, only_direct: bool = False, include_self: bool = True) -> Node | None:
        """The first node holding ``item`` (this one, its children, or anywhere below)."""
        if include_self and self.item == item:
            return self
        candidates = self._children if only_direct else self.dfs_iter()
        for node in candidates:
            if node.item == item:
                return node
        return None

    def path_iter(self, include_self: bool = True) -> Iterator[Node]:
        """This node (unless told not to), then its parent, up to the root."""
        node = self if include_self else self.parent
        while node is not None:
            yield node
            node = node.parent

    def dfs_iter(self, include_self: bool = False, right_to_left: bool = True) -> Iterator[Node]:
        """Depth first, pre-order; children pushed right to left, so read left to right."""
        stack = [self] if include_self else self._pushed(self, right_to_left)
        while stack:
            node = stack.pop()
            yield node
            stack.extend(self._pushed(node, right_to_left))

    def bfs_iter(self, include_self: bool = False, right_to_left: bool = False) -> Iterator[Node]:
        """Breadth first; each level's children queued right to left unless told otherwise."""
        queue: collections.deque[Node] = collections.deque()
        if include_self:
            queue.append(self)
        else:
            queue.extend(self._queued(self, right_to_left))
        while queue:
            node = queue.popleft()
            yield node
            queue.extend(self._queued(node, right_to_left))

    @staticmethod
    def _pushed(node: Node, right_to_left: bool) -> list[Node]:
        return list(reversed(node._children)) if right_to_left else list(node._children)

    @staticmethod
    def _queued(node: Node, right_to_left: bool) -> list[Node]:
        return list(node._children) if right_to_left else list(reversed(node._children))

    def pformat(self) -> str:
        """The tree below this node as indented text, one item a line."""
        lines = [str(self.item)]
        self._pformat_children(lines, prefix="")
        return "\n".join(lines)

    def _pformat_children(self, lines: list[str], prefix: str) -> None:
        last = len(self._children) - 1
        for i, child in enumerate(self._children):
            lines.append(f"{prefix}{_BRANCH}{child.item}")
            child._pformat_children(lines, prefix + (_LAST if i == last else _CONTINUED))

    def to_digraph(self) -> graph_types.DiGraph:
        """A DiGraph of items (with their metadata), edges from parent to child."""
        digraph = graph_types.DiGraph()
        for node in self.dfs_iter(include_self=True):
            digraph.add_node(node.item, **node.metadata)
            if node is not self and node.parent is not None:
                digraph.add_edge(node.parent.item, node.item)
        return digraph
