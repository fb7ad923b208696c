"""Directory backend (``dir:///path``, ``file:///path``): JSON files in a tree.

Layout under the base path (see :mod:`flowengine.persistence.path_based`)::

    books/<uuid>/metadata              the logbook, JSON
    books/<uuid>/<fd uuid>             symlink to ../../flow_details/<fd uuid>
    flow_details/<uuid>/metadata       the flow detail, JSON
    flow_details/<uuid>/<ad uuid>      symlink to ../../atom_details/<ad uuid>
    atom_details/<uuid>/metadata       {"atom": {...}, "type": "TASK_DETAIL"}
    .lock                              lock file (flock) shared by every writer

This is TaskFlow's layout with TaskFlow's documents: each reads the other's
tree. TaskFlow links with absolute symlinks and keeps a ``lock`` file in
each item directory it touched; both are read (and ignored) here.

Safe for several processes and threads at once: writes hold an exclusive
``flock`` on ``.lock``, multi-file reads a shared one, and every file is
replaced atomically (written to a temporary file, then renamed over), so a
reader or a process killed mid-write never sees a half-written record.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import threading
import uuid as uuid_mod
from collections.abc import Iterator
from typing import Any
from urllib import parse

from flowengine import exceptions as exc
from flowengine.persistence import models, path_based
from flowengine.persistence.backends import file_cache, json_codec

__all__ = ["Connection", "DirBackend", "DirConnection"]

#: Name of the file holding an item's JSON inside the item's directory.
ITEM_FILE = "metadata"
#: Lock file under the base path; every connection (in any process) locks it.
LOCK_FILE = ".lock"
#: The lock file TaskFlow's dir backend keeps in each item directory it
#: touched, ``lockf``-locked (fasteners) while it reads or writes the item.
TASKFLOW_ITEM_LOCK = "lock"
#: Default for the ``fsync`` option: a record must survive a machine crash,
#: not only a process crash, or resumption could read an empty file after a
#: power loss (rename alone is not durable on every filesystem). Costs about
#: one disk flush per saved state change; set ``fsync=False`` where the data
#: is disposable (tests, tmpfs).
FSYNC_DEFAULT = True

_KIND_OF_DIR = {"books": "LogBook", "flow_details": "FlowDetail", "atom_details": "AtomDetail"}


def _as_bool(value: Any) -> bool:
    # URL query options arrive as strings ('dir:///x?fsync=false').
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


def _path_from_conf(conf: dict[str, Any]) -> str:
    path = conf.get("path")
    if not path:
        uri = conf.get("connection", "")
        if "://" in uri:
            parsed = parse.urlsplit(uri)
            # 'dir:///abs/path' -> '/abs/path'; 'dir://rel/path' -> 'rel/path'.
            path = parse.unquote(parsed.netloc + parsed.path)
    if not path:
        raise ValueError(
            "The directory backend needs a path: 'dir:///some/path'"
            " or {'connection': 'dir', 'path': '/some/path'}"
        )
    return os.path.abspath(path)


class DirBackend(path_based.PathBasedBackend):
    """Keeps logbooks, flow and atom details as JSON files under ``path``.

    Configuration: ``path`` (or the path of the ``dir:///...`` URL),
    ``fsync`` (default True: flush each file to disk before renaming it in)
    and ``max_cache_size`` (files whose contents are kept in memory, least
    recently used dropped first; None, the default as in TaskFlow: no
    bound). Raises ValueError for a ``max_cache_size`` below 1.
    """

    def __init__(self, conf: dict[str, Any] | None = None) -> None:
        conf = dict(conf or {})
        self._base_path = conf["path"] = _path_from_conf(conf)
        super().__init__(conf)
        self._fsync = _as_bool(self._conf.get("fsync", FSYNC_DEFAULT))
        max_cache_size = self._conf.get("max_cache_size")
        if isinstance(max_cache_size, str):  # from a URL query
            max_cache_size = int(max_cache_size)
        #: Contents of the files read recently (see file_cache.FileCache).
        self.file_cache = file_cache.FileCache(max_cache_size)

    @property
    def base_path(self) -> str:
        """Absolute directory everything is stored under."""
        return self._base_path

    @property
    def lock_path(self) -> str:
        """The lock file every writer holds while writing."""
        return os.path.join(self.base_path, LOCK_FILE)

    @property
    def fsync(self) -> bool:
        """Whether files are flushed to disk before being renamed in."""
        return self._fsync

    def fenced_connection(self, fence: Any) -> Any:
        """A connection whose writes are refused once ``fence`` is superseded.

        See :mod:`flowengine.persistence.fencing`: the fence is checked under
        the same lock as the write.
        """
        from flowengine.persistence import fencing

        return fencing.PathFencedConnection(self.get_connection(), fence)

    def get_connection(self) -> DirConnection:
        """Return a connection (creates the directory tree if missing)."""
        return DirConnection(self)

    def close(self) -> None:
        """Nothing to release (connections close their own lock file)."""


class _FileLock:
    """Re-entrant shared/exclusive ``flock`` on one file, for one connection.

    flock locks belong to the open file, so two connections (two opens) in
    one process exclude each other exactly like two processes do; the
    thread lock makes one connection safe to share between threads.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._exclusive = False

    @contextlib.contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        with self._thread_lock:
            if self._depth:
                if exclusive and not self._exclusive:
                    # Upgrading shared -> exclusive is not atomic with flock
                    # and could deadlock two readers; callers never need it.
                    raise RuntimeError("Cannot take a write lock inside a read lock")
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            self._depth, self._exclusive = 1, exclusive
            try:
                yield
            finally:
                self._depth = 0
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


@contextlib.contextmanager
def _taskflow_item_lock(item_dir: str) -> Iterator[None]:
    """Share TaskFlow's lock of an item it touched while reading the item.

    TaskFlow rewrites an item's file in place under that lock (flowengine
    renames a complete file in, so TaskFlow never sees half of ours): without
    it a TaskFlow write could be read half-done. Items TaskFlow never touched
    have no such file and cost one failed open. (POSIX locks belong to the
    process: do not run TaskFlow and flowengine in one process on one tree
    at the same time, as closing this file would drop TaskFlow's lock.)
    """
    try:
        fd = os.open(os.path.join(item_dir, TASKFLOW_ITEM_LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


class DirConnection(path_based.PathBasedConnection):
    """A connection to a DirBackend."""

    def __init__(self, backend: DirBackend) -> None:
        super().__init__(backend)
        self._dir_backend = backend
        self._fsync = backend.fsync
        self._lock = _FileLock(backend.lock_path)
        self.upgrade()

    @property
    def backend(self) -> DirBackend:
        """The backend this connection belongs to."""
        return self._dir_backend

    # Locking and error translation.

    @contextlib.contextmanager
    def _guard(self, exclusive: bool) -> Iterator[None]:
        try:
            with self._lock.hold(exclusive):
                yield
        except exc.FlowEngineError:
            raise
        except OSError as e:
            raise exc.StorageFailure(
                f"Storage backend internal error under {self.backend.base_path}: {e}", cause=e
            ) from e

    def _transaction(self) -> contextlib.AbstractContextManager[Any]:
        return self._guard(exclusive=True)

    # Item access (called with the lock held by the public methods).

    def _join_path(self, *parts: str) -> str:
        return os.path.join(*parts)

    def _what(self, path: str, value: Any) -> str:
        kind = _KIND_OF_DIR.get(os.path.basename(os.path.dirname(path)), "record")
        record = value.get("atom", value) if isinstance(value, dict) else {}
        return json_codec.describe(record, kind) if isinstance(record, dict) else path

    def _get_item(self, path: str) -> Any:
        item_path = os.path.join(path, ITEM_FILE)
        try:
            with _taskflow_item_lock(path):
                text = self.backend.file_cache.read(item_path)
        except FileNotFoundError:
            raise exc.NotFound(f"Path '{path}' not found")
        return json_codec.decode(text, f"file {item_path!r}")

    def _exists(self, path: str) -> bool:
        if os.path.dirname(path) == self.backend.base_path:
            return os.path.isdir(path)
        return os.path.exists(os.path.join(path, ITEM_FILE))

    def _encode(self, path: str, value: Any) -> bytes:
        what = self._what(path, value)
        if isinstance(value, dict) and set(value) == {"atom", "type"}:
            # Encode the atom itself first so an error names its field.
            atom = json_codec.encode(value["atom"], what)
            kind = json_codec.encode_field(value["type"], what, "type")
            return ('{"atom":' + atom + ',"type":' + kind + "}").encode()
        return json_codec.encode(value, what).encode()

    def _set_item(self, path: str, value: Any, transaction: Any) -> None:
        data = self._encode(path, value)  # before touching the disk
        os.makedirs(path, exist_ok=True)
        item_path = os.path.join(path, ITEM_FILE)
        tmp_path = os.path.join(path, f".{ITEM_FILE}.{os.getpid()}.{uuid_mod.uuid4().hex}.tmp")
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp_path, item_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_path)
            raise

    def _del_tree(self, path: str, transaction: Any) -> None:
        with contextlib.suppress(FileNotFoundError):
            if os.path.islink(path):
                # A logbook's link to a flow detail: the link goes, not its target.
                os.unlink(path)
            else:
                shutil.rmtree(path)

    def _get_children(self, path: str) -> list[str]:
        # Children are item directories (books) or links (a book's flows, a
        # flow's atoms); files are not: our metadata and temporary files,
        # and the 'lock' file TaskFlow's backend keeps in each item directory.
        try:
            with os.scandir(path) as entries:
                return sorted(
                    e.name
                    for e in entries
                    if not e.name.startswith(".")
                    and (e.is_symlink() or e.is_dir(follow_symlinks=False))
                )
        except FileNotFoundError:
            raise exc.NotFound(f"Path '{path}' not found")

    def _ensure_path(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def _create_link(self, src_path: str, dest_path: str, transaction: Any) -> None:
        target = os.path.relpath(src_path, os.path.dirname(dest_path))
        try:
            os.symlink(target, dest_path)
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise

    # Public API: the shared logic, run under the right lock. Iterators are
    # materialised under the lock so it is never held across a yield.

    def upgrade(self) -> None:
        """Create the base directory and the three item directories."""
        try:
            os.makedirs(self.backend.base_path, exist_ok=True)
        except OSError as e:
            raise exc.StorageFailure(
                f"Unable to create backend path {self.backend.base_path}: {e}", cause=e
            ) from e
        with self._guard(exclusive=True):
            super().upgrade()

    def validate(self) -> None:
        """Check the tree exists and the lock can be taken."""
        with self._guard(exclusive=False):
            super().validate()

    def get_logbook(self, book_uuid: str, lazy: bool = False) -> models.LogBook:
        """Load a logbook (with its flow details unless lazy); NotFound if unknown."""
        with self._guard(exclusive=False):
            return super().get_logbook(book_uuid, lazy=lazy)

    def get_logbooks(self, lazy: bool = False) -> Iterator[models.LogBook]:
        """Iterate over every stored logbook (half-created ones are skipped)."""
        with self._guard(exclusive=False):
            books = []
            for book_uuid in self._get_children(self.book_path):
                try:
                    books.append(super().get_logbook(book_uuid, lazy=lazy))
                except exc.NotFound:
                    continue  # a writer died between mkdir and the first write
        return iter(books)

    def get_flows_for_book(self, book_uuid: str, lazy: bool = False) -> Iterator[models.FlowDetail]:
        """Iterate over the flow details of a logbook."""
        with self._guard(exclusive=False):
            return iter(list(super().get_flows_for_book(book_uuid, lazy=lazy)))

    def get_flow_details(self, fd_uuid: str, lazy: bool = False) -> models.FlowDetail:
        """Load a flow detail (with its atom details unless lazy); NotFound if unknown."""
        with self._guard(exclusive=False):
            return super().get_flow_details(fd_uuid, lazy=lazy)

    def get_atom_details(self, ad_uuid: str) -> models.AtomDetail:
        """Load an atom detail; NotFound if unknown."""
        with self._guard(exclusive=False):
            return super().get_atom_details(ad_uuid)

    def get_atoms_for_flow(self, fd_uuid: str) -> Iterator[models.AtomDetail]:
        """Iterate over the atom details of a flow detail."""
        with self._guard(exclusive=False):
            return iter(list(super().get_atoms_for_flow(fd_uuid)))

    def close(self) -> None:
        """Release the lock file."""
        self._lock.close()


#: TaskFlow's name for this backend's connection class.
Connection = DirConnection
