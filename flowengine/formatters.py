"""Describe a task failure with what ran before it, as TaskFlow's logs do.

:class:`FailureFormatter` renders the atoms that led to a failed task (its
predecessors in the execution graph, most recent first) with their intention,
state, arguments and results, in TaskFlow's tree layout::

    2 predecessors (most recent first):
      Atom 'a' {'intention': 'EXECUTE', 'state': 'SUCCESS', 'requires': {}, 'provides': 1}
      |__Flow 'f'
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.types import tree

# Node kinds of the compiled execution graph (see the compiler).
TASK = "task"
RETRY = "retry"
FLOW = "flow"
FLOW_END = "flow_end"
ATOMS = (TASK, RETRY)

# A predecessor *tree* repeats shared ancestors once per path, which grows
# exponentially on dense graphs; past this many nodes the rest is left out so
# a failure report can never stall the engine.
MAX_TREE_NODES = 10_000

_MISSING = object()

#: What a masked value is shown as (secrets in arguments or results).
MASK = "***"


class _TreeNode:
    """One occurrence of a graph node in the predecessor tree."""

    __slots__ = ("name", "data", "children")

    def __init__(self, name: str, data: dict[str, Any]) -> None:
        self.name = name
        self.data = data
        self.children: list[_TreeNode] = []

    def descendants(self) -> Iterator[_TreeNode]:
        stack = list(reversed(self.children))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def _predecessor_tree(graph: Any, atom_name: str) -> _TreeNode:
    """Tree of every path leading into ``atom_name``, flow end markers skipped."""
    root = _TreeNode(atom_name, graph.nodes[atom_name])
    stack = [(root, atom_name)]
    budget = MAX_TREE_NODES
    while stack and budget > 0:
        parent, name = stack.pop()
        for pred in graph.predecessors(name):
            data = graph.nodes[pred]
            if data.get("kind") == FLOW_END:
                # Skip the end marker; as TaskFlow does, the atoms that closed
                # the subflow are walked through (their predecessors attach
                # here) but not shown themselves, so parsed output stays alike.
                stack.extend((parent, pred_pred) for pred_pred in graph.predecessors(pred))
                continue
            child = _TreeNode(pred, data)
            parent.children.append(child)
            stack.append((child, pred))
            budget -= 1
            if budget <= 0:
                break
    return root


def _render_tree(
    top: _TreeNode, stringify: Callable[[_TreeNode], str], starting_prefix: str = ""
) -> str:
    """Draw ``top`` and its subtree with ``|__`` connectors, one line per node."""
    lines = [starting_prefix + stringify(top)]
    # Each stack entry carries the column prefix its children inherit.
    stack: list[tuple[_TreeNode, str, bool]] = [
        (child, "", i == len(top.children) - 1)
        for i, child in reversed(list(enumerate(top.children)))
    ]
    while stack:
        node, columns, is_last = stack.pop()
        lines.append(starting_prefix + columns + "|__" + stringify(node))
        below = columns + (" " if is_last else "|") + "  "
        last_index = len(node.children) - 1
        stack.extend(
            (child, below, i == last_index) for i, child in reversed(list(enumerate(node.children)))
        )
    return os.linesep.join(lines)


def _flow_name(node: _TreeNode) -> str:
    flow = node.data.get("flow")
    if flow is not None:
        flow_name: str = flow.name
        return flow_name
    name: str | None = node.data.get("name")
    if name is not None:
        return name
    # Compiled flow nodes are named "<flow name>[<suffix>]" to stay unique.
    base, bracket, _ = node.name.rpartition("[")
    return base if bracket else node.name


class FailureFormatter:
    """Formats a task failure together with the atoms and flows that preceded it."""

    # Only failures while executing have a meaningful "what ran before" story.
    _BUILDERS = {states.EXECUTE: (_predecessor_tree, "predecessors")}

    def __init__(
        self,
        engine: Any,
        hide_inputs_outputs_of: Any = (),
        mask_inputs_keys: Any = (),
        mask_outputs_keys: Any = (),
    ) -> None:
        self._engine = engine
        self._hide_inputs_outputs_of = hide_inputs_outputs_of
        self._mask_inputs_keys = frozenset(mask_inputs_keys)
        self._mask_outputs_keys = frozenset(mask_outputs_keys)

    def _mask_keys(self, data: Any, mask_keys: Any) -> Any:
        """``data`` with the value of every key in ``mask_keys`` (at any depth) shown as ***.

        Dicts and lists are copied, never changed in place; anything else is
        returned as it is.
        """
        if isinstance(data, dict):
            return {
                key: MASK if key in mask_keys else self._mask_keys(value, mask_keys)
                for key, value in data.items()
            }
        if isinstance(data, list):
            return [self._mask_keys(item, mask_keys) for item in data]
        return data

    @staticmethod
    def _cached(cache: dict[str, Any], atom_name: str, fetch: Callable[[], Any]) -> Any:
        try:
            return cache[atom_name]
        except KeyError:
            try:
                value = fetch()
            except (exc.StorageFailure, exc.NotFound):
                value = _MISSING
            cache[atom_name] = value
            return value

    def _format_node(self, storage: Any, caches: dict[str, dict[str, Any]], node: _TreeNode) -> str:
        kind = node.data.get("kind")
        if kind == FLOW:
            return f"Flow '{_flow_name(node)}'"
        if kind not in ATOMS:
            raise TypeError(f"Unable to format node, unknown node kind '{kind}' encountered")
        atom = node.data.get("atom")
        name = atom.name if atom is not None else node.name
        attrs: dict[str, Any] = {}
        fetchers: list[tuple[str, Callable[[], Any]]] = [
            ("intention", lambda: storage.get_atom_intention(name)),
            ("state", lambda: storage.get_atom_state(name)),
        ]
        if name not in self._hide_inputs_outputs_of:
            if atom is not None:
                fetchers.append(
                    (
                        "requires",
                        lambda: storage.fetch_mapped_args(
                            atom.rebind, atom_name=name, optional_args=atom.optional
                        ),
                    )
                )
            fetchers.append(("provides", lambda: storage.get_execute_result(name)))
        masks = {"requires": self._mask_inputs_keys, "provides": self._mask_outputs_keys}
        for key, fetch in fetchers:
            value = self._cached(caches[key], name, fetch)
            if value is not _MISSING:
                attrs[key] = self._mask_keys(value, masks[key]) if masks.get(key) else value
        if attrs:
            return f"Atom '{name}' {attrs}"
        return f"Atom '{name}'"

    def _compiled_graph(self) -> Any:
        try:
            compilation = self._engine.compilation
        except Exception:
            # Not compiled yet (or the engine refuses): there is no graph to show.
            return None
        return getattr(compilation, "execution_graph", None)

    @staticmethod
    def _matched_atom(graph: Any, atom_matcher: Callable[[Any], bool]) -> str | None:
        """Name of the first compiled atom ``atom_matcher`` accepts (TaskFlow's interface).

        The matcher is given a tree node whose ``item`` is the atom, as
        TaskFlow's formatters are given the nodes of its compilation hierarchy.
        """
        for name, data in graph.nodes(data=True):
            atom = data.get("atom")
            if data.get("kind") in ATOMS and atom is not None and atom_matcher(tree.Node(atom)):
                return str(name)
        return None

    def format(self, fail: Any, atom_matcher: str | Callable[[Any], bool]) -> tuple[Any, str]:
        """Return ``(exc_info, details)`` for a failure of a task.

        ``atom_matcher`` is the task's name, or (as in TaskFlow) a callable
        given tree nodes whose ``item`` is an atom, true for the failed one.
        """
        parts: list[str] = []
        if fail.exc_info is None:
            # A failure from another process has no live traceback: use its text.
            parts.append(fail.pformat(traceback=True) + os.linesep)
        storage = getattr(self._engine, "storage", None)
        graph = self._compiled_graph()
        atom_name: str | None
        if callable(atom_matcher):
            atom_name = None if graph is None else self._matched_atom(graph, atom_matcher)
        else:
            atom_name = atom_matcher
        if storage is None or graph is None or atom_name is None or atom_name not in graph:
            return fail.exc_info, "".join(parts)
        try:
            intention = storage.get_atom_intention(atom_name)
        except (exc.StorageFailure, exc.NotFound):
            intention = None
        if intention not in self._BUILDERS:
            return fail.exc_info, "".join(parts)
        builder, kind = self._BUILDERS[intention]
        root = builder(graph, atom_name)
        caches: dict[str, dict[str, Any]] = {
            "intention": {},
            "state": {},
            "requires": {},
            "provides": {},
        }
        total = sum(1 for _ in root.descendants())
        parts.append(f"{total} {kind} (most recent first):" + os.linesep)

        def stringify(node: _TreeNode) -> str:
            return self._format_node(storage, caches, node)

        parts.append(
            os.linesep.join(
                _render_tree(child, stringify, starting_prefix="  ") for child in root.children
            )
        )
        return fail.exc_info, "".join(parts)
