"""In-memory (non-persistent) backend over a small fake filesystem.

Useful for tests and for engines run without a backend: storage then uses
a ``MemoryBackend({'deep_copy': False})`` so saving is cheap.
"""

from __future__ import annotations

import contextlib
import copy
import posixpath
import threading
from collections.abc import Iterator
from typing import Any

from flowengine import exceptions as exc
from flowengine.persistence import base, models, path_based

__all__ = ["FakeFilesystem", "MemoryBackend", "MemoryConnection"]


def _as_bool(value: Any) -> bool:
    # URL query options arrive as strings ('memory://?deep_copy=false').
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


class LiveAtom:
    """A stored atom detail kept as the object itself, formatted when read.

    Only the throwaway backend a storage makes for itself when given none
    holds these (see :meth:`MemoryBackend.private`): its storage saves
    every change to a detail right after making it, so the object and what
    a formatted copy taken at save time would say are the same, and a save
    costs nothing.
    """

    __slots__ = ("detail",)

    def __init__(self, detail: models.AtomDetail) -> None:
        self.detail = detail

    def materialize(self) -> dict[str, Any]:
        """The stored form (``persistence.base.format_atom``) as of now."""
        return base.format_atom(self.detail)


#: Children of a node that has none (shared; _add_child replaces it).
_NO_CHILDREN: dict[str, Any] = {}


class _Inode:
    """One node of the fake filesystem: a value or a link, plus children."""

    __slots__ = ("name", "path", "value", "target", "children", "parent")

    def __init__(
        self, name: str, path: str, parent: _Inode | None = None, value: Any = None
    ) -> None:
        self.name = name
        self.path = path
        self.value = value
        self.target: str | None = None
        self.children: dict[str, _Inode] = _NO_CHILDREN
        self.parent = parent

    def bfs(self) -> Iterator[_Inode]:
        # Each node's children newest first, as TaskFlow's FakeFilesystem
        # lists them (its ls_r order is part of what its tests check).
        queue = list(reversed(self.children.values()))
        i = 0
        while i < len(queue):
            node = queue[i]
            i += 1
            yield node
            queue.extend(reversed(node.children.values()))


class FakeFilesystem:
    """A posix-path, in-memory filesystem with values at nodes and symlinks.

    Not thread-safe by itself for concurrent writers; the memory backend
    serialises access with its lock.
    """

    #: The root path.
    root_path = posixpath.sep

    def __init__(self, deep_copy: bool = True) -> None:
        self._root = _Inode(self.root_path, self.root_path)
        self._index: dict[str, _Inode] = {self.root_path: self._root}
        # Live atom details not given nodes yet: (atoms dir, flow dir, details).
        self._deferred: list[tuple[str, str, list[models.AtomDetail]]] = []
        # deep_copy isolates stored values from later mutation by the caller;
        # without it only the top-level container is copied (much cheaper).
        self._deep_copy = deep_copy
        self._copier = copy.deepcopy if deep_copy else copy.copy

    @property
    def _nodes(self) -> dict[str, _Inode]:
        """Path -> node, every deferred atom given its nodes first."""
        if self._deferred:
            self._settle()
        return self._index

    def defer_live_atoms(
        self, atoms_path: str, flow_path: str, details: list[models.AtomDetail]
    ) -> None:
        """Store ``details`` live under ``atoms_path``, linked from ``flow_path`` (both exist).

        Nothing is built until the filesystem is next read (any lookup by
        path, a listing, pformat): a storage saving into its private
        backend never reads it back, so a flow's atoms cost one list here.
        """
        self._deferred.append((atoms_path, flow_path, details))

    def _indexed(self, path: str, children: bool = True) -> dict[str, _Inode]:
        """Path -> node, with deferred atoms given nodes first if ``path`` may concern them.

        That is when ``path`` may be one of their nodes, or (``children``: the
        caller will look below ``path``) a directory they go in or one of its
        ancestors. Writing a directory's own value (a flow detail) does not.
        """
        if self._deferred:
            below = path.rstrip("/") + "/"
            for atoms_path, flow_path, _details in self._deferred:
                for folder in (atoms_path, flow_path):
                    if (
                        path.startswith(folder + "/")
                        or children
                        and (path == folder or folder.startswith(below))
                    ):
                        self._settle()
                        return self._index
        return self._index

    def _settle(self) -> None:
        deferred, self._deferred = self._deferred, []
        index = self._index
        for atoms_path, flow_path, details in deferred:
            atoms_node, flow_node = index[atoms_path], index[flow_path]
            for ad in details:
                uuid = ad.uuid
                node = atoms_node.children.get(uuid)
                if node is None:
                    self._add_child(atoms_node, uuid, LiveAtom(ad))
                else:
                    node.value = LiveAtom(ad)
                link = flow_node.children.get(uuid)
                if link is None:
                    link = self._add_child(flow_node, uuid)
                link.target = atoms_node.path + "/" + uuid

    @classmethod
    def normpath(cls, path: str) -> str:
        """Return the normalised absolute form of ``path`` (ValueError if relative)."""
        if not path:
            raise ValueError("This filesystem can only normalize paths that are not empty")
        if not path.startswith(cls.root_path):
            raise ValueError(
                "This filesystem can only normalize paths that start"
                f" with {cls.root_path}: '{path}' is not valid"
            )
        return posixpath.normpath(path)

    @staticmethod
    def split(path: str) -> tuple[str, str]:
        """Split a path into ``(head, tail)``."""
        return posixpath.split(path)

    @staticmethod
    def join(*pieces: str) -> str:
        """Join path pieces with the separator."""
        return posixpath.sep.join(pieces)

    def _node(self, path: str) -> _Inode:
        try:
            return self._indexed(path)[path]
        except KeyError:
            raise exc.NotFound(f"Path '{path}' not found")

    def _add_child(self, parent: _Inode, name: str, value: Any = None) -> _Inode:
        path = parent.path + name if parent is self._root else parent.path + "/" + name
        node = _Inode(name, path, parent=parent, value=value)
        if parent.children is _NO_CHILDREN:
            parent.children = {}
        parent.children[name] = node
        self._index[path] = node
        return node

    def ensure_path(self, path: str) -> None:
        """Create ``path`` and its parents if missing."""
        path = self.normpath(path)
        if path in self._indexed(path, children=False):
            return
        node = self._root
        for piece in path.split(posixpath.sep)[1:]:
            child = node.children.get(piece)
            node = child if child is not None else self._add_child(node, piece)

    def isolate(self, fresh_value: Any) -> Any:
        """Copy a just-built value only when deep copies are wanted (else keep it)."""
        return self._copier(fresh_value) if self._deep_copy else fresh_value

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        path = self.normpath(path)
        return path in self._indexed(path, children=False)

    def _resolve(self, path: str) -> _Inode:
        node = self._node(path)
        seen = [path]
        while node.target is not None:
            if node.target in seen:
                raise ValueError(
                    "Recursive link following not allowed (loop %s detected)"
                    % (seen + [node.target])
                )
            seen.append(node.target)
            node = self._node(node.target)
        return node

    def __getitem__(self, path: str) -> Any:
        value = self._resolve(self.normpath(path)).value
        if type(value) is LiveAtom:
            return value.materialize()
        return self._copier(value)

    def get(self, path: str, default: Any = None) -> Any:
        """Return the value at ``path`` (links followed) or ``default``."""
        try:
            return self[path]
        except exc.NotFound:
            return default

    def __setitem__(self, path: str, value: Any) -> None:
        self.put_normalized(self.normpath(path), self._copier(value))

    def put_normalized(self, path: str, value: Any) -> None:
        """Store ``value`` as is at an already normalised ``path`` (parent must exist)."""
        node = self._indexed(path, children=False).get(path)
        if node is not None:
            node.value = value
            return
        parent_path, name = self.split(path)
        self._add_child(self._node(parent_path), name, value=value)

    def __delitem__(self, path: str) -> None:
        self.delete(path, recursive=True)

    def __contains__(self, path: str) -> bool:
        return self.exists(path)

    def delete(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (ValueError if it has children and not recursive)."""
        path = self.normpath(path)
        node = self._node(path)
        if not recursive:
            if node is self._root:
                raise ValueError(f"Can not delete '{self._root.name}'")
            if node.children:
                raise ValueError(f"Can not delete '{path}', it has {len(node.children)} children")
        for child in list(node.bfs()):
            self._nodes.pop(child.path, None)
        if node is self._root:
            node.children = {}
            return
        self._nodes.pop(path, None)
        if node.parent is not None:
            node.parent.children.pop(node.name, None)

    def clear(self) -> None:
        """Remove everything but the root."""
        self._root.children = {}
        self._index = {self.root_path: self._root}
        self._deferred = []

    def symlink(self, src_path: str, dest_path: str) -> None:
        """Make ``dest_path`` a link to ``src_path``."""
        self.symlink_normalized(self.normpath(src_path), self.normpath(dest_path))

    def symlink_normalized(self, src_path: str, dest_path: str) -> None:
        """``symlink`` for already normalised paths."""
        node = self._indexed(dest_path, children=False).get(dest_path)
        if node is None:
            parent_path, name = self.split(dest_path)
            node = self._add_child(self._node(parent_path), name)
        node.target = src_path

    def _relative(self, top: _Inode, node: _Inode) -> str:
        if top is self._root:
            return node.path[1:]
        return node.path[len(top.path) + 1 :]

    def ls(self, path: str, absolute: bool = False) -> list[str]:
        """Names (or absolute paths) of the direct children of ``path``."""
        node = self._node(self.normpath(path))
        if absolute:
            return [child.path for child in node.children.values()]
        return list(node.children)

    def ls_r(self, path: str, absolute: bool = False) -> list[str]:
        """Paths of every descendant of ``path``, breadth first."""
        top = self._node(self.normpath(path))
        if absolute:
            return [node.path for node in top.bfs()]
        return [self._relative(top, node) for node in top.bfs()]

    def pformat(self) -> str:
        """Draw the tree, links shown as ``name (link to target)``."""
        if self._deferred:
            self._settle()
        lines = [self._root.name]

        def draw(node: _Inode, prefix: str) -> None:
            children = list(node.children.values())
            for i, child in enumerate(children):
                label = child.name
                if child.target is not None:
                    label = f"{child.name} (link to {child.target})"
                lines.append(prefix + "|__" + label)
                # The vertical bar continues only while later siblings follow.
                draw(child, prefix + ("   " if i == len(children) - 1 else "|  "))

        draw(self._root, "")
        return "\n".join(lines)


class MemoryBackend(path_based.PathBasedBackend):
    """Keeps logbooks, flow and atom details in a FakeFilesystem (``memory``).

    Configuration: ``path`` (base path, default '/'), ``deep_copy`` (bool,
    default True: stored values are isolated from the caller's objects).
    Not transactional, but thread-safe: one lock serialises all access.
    """

    DEFAULT_PATH = posixpath.sep

    def __init__(self, conf: dict[str, Any] | None = None) -> None:
        super().__init__(conf)
        self.memory = FakeFilesystem(deep_copy=_as_bool(self._conf.get("deep_copy", True)))
        self.lock = threading.RLock()
        # Atom details kept as LiveAtom (see private()); never for a backend
        # someone else may save arbitrary objects to.
        self._live_atoms = False

    @classmethod
    def private(cls) -> MemoryBackend:
        """The backend a storage given no backend keeps its flow in (``deep_copy`` off).

        Atom details are kept as the storage's own objects and formatted
        when read: a storage saves each change right after making it, so
        reads give what they would with a copy per save, and the engine's
        four saves per task cost nothing.
        """
        backend = cls({"deep_copy": False})
        backend._live_atoms = True
        return backend

    def fenced_connection(self, fence: Any) -> Any:
        """A connection whose writes are refused once ``fence`` is superseded.

        See :mod:`flowengine.persistence.fencing`: the fence is checked under
        the same lock as the write.
        """
        from flowengine.persistence import fencing

        return fencing.PathFencedConnection(self.get_connection(), fence)

    def get_connection(self) -> MemoryConnection:
        """Return a connection (cheap: no resources are held)."""
        return MemoryConnection(self)

    def close(self) -> None:
        """Nothing to release."""


class MemoryConnection(path_based.PathBasedConnection):
    """A connection to a MemoryBackend."""

    def __init__(self, backend: MemoryBackend) -> None:
        super().__init__(backend)
        self._memory = backend.memory
        self._lock = backend.lock
        self._atom_prefix = self.atom_path.rstrip("/") + "/"
        self._live = backend._live_atoms
        self.upgrade()

    def _write_flow(self, fd: models.FlowDetail, transaction: Any, ignore_missing: bool) -> None:
        if not self._live:
            super()._write_flow(fd, transaction, ignore_missing)
            return
        # The private backend's bulk path (a flow's atoms registered at once):
        # the atoms kept live, their nodes made when someone reads.
        self._write(fd, transaction, ignore_missing)
        self._memory.defer_live_atoms(
            self._atom_path, self._join_path(self._flow_path, fd.uuid), list(fd)
        )

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            except exc.FlowEngineError:
                raise
            except Exception as e:
                raise exc.StorageFailure(f"Storage backend internal error: {e}", cause=e)

    def _join_path(self, *parts: str) -> str:
        # Pieces after the first are uuids/names, never absolute: a plain join
        # is equivalent to posixpath.join and much cheaper.
        return parts[0].rstrip("/") + "/" + "/".join(parts[1:])

    def _get_item(self, path: str) -> Any:
        with self._guard():
            return self._memory[path]

    def _exists(self, path: str) -> bool:
        with self._lock:
            return self._memory.exists(path)

    # Paths reaching _set_item/_create_link come from _join_path: already
    # normalised, and the values were just built by to_dict.
    def _set_item(self, path: str, value: Any, transaction: Any) -> None:
        self._memory.put_normalized(path, self._memory.isolate(value))

    def _del_tree(self, path: str, transaction: Any) -> None:
        if self._memory.exists(path):
            self._memory.delete(path, recursive=True)

    def _get_children(self, path: str) -> list[str]:
        with self._guard():
            return self._memory.ls(path)

    def _ensure_path(self, path: str) -> None:
        with self._guard():
            self._memory.ensure_path(path)

    def _create_link(self, src_path: str, dest_path: str, transaction: Any) -> None:
        self._memory.symlink_normalized(src_path, dest_path)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._guard():
            yield None

    def validate(self) -> None:
        """Always usable."""

    def update_atom_details(
        self, atom_detail: models.AtomDetail, ignore_missing: bool = False
    ) -> models.AtomDetail:
        """Save an existing atom detail (NotFound if unknown, unless ignore_missing)."""
        # Hot path (one call per atom state change): skip the generic
        # path-building and context-manager layers of the base class.
        path = self._atom_prefix + atom_detail.uuid
        if self._live:
            with self._lock:
                node = self._memory._nodes.get(path)
                if node is None:
                    if not ignore_missing:
                        raise exc.NotFound(f"No AtomDetail found with uuid '{atom_detail.uuid}'")
                    self._memory.put_normalized(path, LiveAtom(atom_detail))
                elif type(node.value) is not LiveAtom or node.value.detail is not atom_detail:
                    node.value = LiveAtom(atom_detail)
            return atom_detail
        data = base.format_atom(atom_detail)
        with self._lock:
            node = self._memory._nodes.get(path)
            if node is None:
                if not ignore_missing:
                    raise exc.NotFound(f"No AtomDetail found with uuid '{atom_detail.uuid}'")
                self._memory[path] = data
            else:
                node.value = self._memory.isolate(data)
        return atom_detail
