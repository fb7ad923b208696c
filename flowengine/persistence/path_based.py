"""Shared logic of backends that store each model as one item under a path.

Layout under the backend's base path::

    books/<book uuid>                  the logbook dict
    books/<book uuid>/<fd uuid>        link to flow_details/<fd uuid>
    flow_details/<fd uuid>             the flow detail dict
    flow_details/<fd uuid>/<ad uuid>   link to atom_details/<ad uuid>
    atom_details/<ad uuid>             {'type': ..., 'atom': the atom detail dict}

Subclasses (memory, directory...) only say how to read, write, list and
link items; this module decides what goes where. It is TaskFlow's layout,
and the items are TaskFlow's dicts (a logbook's times as TaskFlow marshals
them, see :func:`taskflow_time`), so TaskFlow and flowengine read each
other's trees.
"""

from __future__ import annotations

import abc
import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

from flowengine import exceptions as exc
from flowengine.persistence import base, models

__all__ = ["PathBasedBackend", "PathBasedConnection", "taskflow_time"]


def taskflow_time(when: datetime.datetime | None) -> dict[str, int] | None:
    """``when`` as TaskFlow stores a logbook's times: its UTC fields, no zone name.

    (oslo.utils' ``marshall_now`` of a naive UTC datetime, which TaskFlow's
    ``LogBook.from_dict(..., unmarshal_time=True)`` requires.)
    """
    if when is None:
        return None
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC)
    return {
        "day": when.day,
        "month": when.month,
        "year": when.year,
        "hour": when.hour,
        "minute": when.minute,
        "second": when.second,
        "microsecond": when.microsecond,
    }


class PathBasedBackend(base.Backend, metaclass=abc.ABCMeta):
    """A backend whose connections address items by path under ``path``."""

    #: Base path used when the configuration gives none.
    DEFAULT_PATH: str | None = None

    def __init__(self, conf: dict[str, Any] | None = None) -> None:
        super().__init__(conf)
        self._path = self._conf.get("path") or self.DEFAULT_PATH

    @property
    def path(self) -> str | None:
        """The base path everything is stored under."""
        return self._path


class PathBasedConnection(base.Connection, metaclass=abc.ABCMeta):
    """Connection logic shared by path-based backends."""

    def __init__(self, backend: PathBasedBackend) -> None:
        self._backend = backend
        if backend.path is None:
            raise ValueError(
                f"{type(backend).__name__} needs a base path: give one as"
                f" 'path' in its configuration"
            )
        self._book_path = self._join_path(backend.path, "books")
        self._flow_path = self._join_path(backend.path, "flow_details")
        self._atom_path = self._join_path(backend.path, "atom_details")

    @property
    def backend(self) -> PathBasedBackend:
        """The backend this connection belongs to."""
        return self._backend

    @property
    def book_path(self) -> str:
        """Where logbooks live."""
        return self._book_path

    @property
    def flow_path(self) -> str:
        """Where flow details live."""
        return self._flow_path

    @property
    def atom_path(self) -> str:
        """Where atom details live."""
        return self._atom_path

    # What subclasses provide.

    @abc.abstractmethod
    def _join_path(self, *parts: str) -> str:
        """Join path pieces."""

    @abc.abstractmethod
    def _get_item(self, path: str) -> Any:
        """Return the item stored at path (NotFound if none)."""

    @abc.abstractmethod
    def _exists(self, path: str) -> bool:
        """Whether an item is stored at path."""

    @abc.abstractmethod
    def _set_item(self, path: str, value: Any, transaction: Any) -> None:
        """Store value at path (creating it)."""

    @abc.abstractmethod
    def _del_tree(self, path: str, transaction: Any) -> None:
        """Delete path and everything under it."""

    @abc.abstractmethod
    def _get_children(self, path: str) -> list[str]:
        """Names of the children of path (NotFound if path is missing)."""

    @abc.abstractmethod
    def _ensure_path(self, path: str) -> None:
        """Create path (and parents) if missing."""

    @abc.abstractmethod
    def _create_link(self, src_path: str, dest_path: str, transaction: Any) -> None:
        """Make dest_path a link to src_path."""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[Any]:
        """Context manager grouping several writes."""

    # The Connection interface, in terms of the above.

    def _obj_path(self, obj: Any) -> str:
        if isinstance(obj, models.AtomDetail):
            return self._join_path(self._atom_path, obj.uuid)
        if isinstance(obj, models.FlowDetail):
            return self._join_path(self._flow_path, obj.uuid)
        if isinstance(obj, models.LogBook):
            return self._join_path(self._book_path, obj.uuid)
        raise exc.StorageFailure(f"Invalid storage class {type(obj)}")

    def _write(self, obj: Any, transaction: Any, ignore_missing: bool) -> None:
        path = self._obj_path(obj)
        if not ignore_missing and not self._exists(path):
            raise exc.NotFound(f"No {type(obj).__name__} found with uuid '{obj.uuid}'")
        data: dict[str, Any]
        if isinstance(obj, models.AtomDetail):
            data = base.format_atom(obj)
        elif isinstance(obj, models.LogBook):
            data = obj.to_dict(marshal_time=False)
            for key in ("created_at", "updated_at"):
                data[key] = taskflow_time(data[key])
        else:
            data = obj.to_dict()
        self._set_item(path, data, transaction)

    def _write_flow(self, fd: models.FlowDetail, transaction: Any, ignore_missing: bool) -> None:
        self._write(fd, transaction, ignore_missing)
        flow_path = self._obj_path(fd)
        for ad in fd:
            self._write(ad, transaction, True)
            self._create_link(self._obj_path(ad), self._join_path(flow_path, ad.uuid), transaction)

    def update_atom_details(
        self, atom_detail: models.AtomDetail, ignore_missing: bool = False
    ) -> models.AtomDetail:
        """Save an existing atom detail (NotFound if unknown, unless ignore_missing)."""
        with self._transaction() as txn:
            self._write(atom_detail, txn, ignore_missing)
        return atom_detail

    def update_flow_details(
        self, flow_detail: models.FlowDetail, ignore_missing: bool = False
    ) -> models.FlowDetail:
        """Save a flow detail and the atom details it contains."""
        with self._transaction() as txn:
            self._write_flow(flow_detail, txn, ignore_missing)
        return flow_detail

    def save_logbook(self, book: models.LogBook) -> models.LogBook:
        """Create or update a logbook and everything it contains."""
        with self._transaction() as txn:
            self._write(book, txn, True)
            book_path = self._obj_path(book)
            for fd in book:
                self._write_flow(fd, txn, True)
                self._create_link(self._obj_path(fd), self._join_path(book_path, fd.uuid), txn)
        return book

    def _load(self, kind: str, path: str, uuid: str) -> Any:
        try:
            return self._get_item(path)
        except exc.NotFound:
            raise exc.NotFound(f"No {kind} found with uuid '{uuid}'")

    def get_logbook(self, book_uuid: str, lazy: bool = False) -> models.LogBook:
        """Load a logbook (with its flow details unless lazy); NotFound if unknown."""
        data = self._load("logbook", self._join_path(self._book_path, book_uuid), book_uuid)
        book = models.LogBook.from_dict(data)
        if not lazy:
            for fd in self.get_flows_for_book(book_uuid):
                book.add(fd)
        return book

    def get_logbooks(self, lazy: bool = False) -> Iterator[models.LogBook]:
        """Iterate over every stored logbook."""
        for book_uuid in self._get_children(self._book_path):
            yield self.get_logbook(book_uuid, lazy=lazy)

    def get_flows_for_book(self, book_uuid: str, lazy: bool = False) -> Iterator[models.FlowDetail]:
        """Iterate over the flow details of a logbook."""
        try:
            children = self._get_children(self._join_path(self._book_path, book_uuid))
        except exc.NotFound:
            raise exc.NotFound(f"No logbook found with uuid '{book_uuid}'")
        for fd_uuid in children:
            yield self.get_flow_details(fd_uuid, lazy=lazy)

    def get_flow_details(self, fd_uuid: str, lazy: bool = False) -> models.FlowDetail:
        """Load a flow detail (with its atom details unless lazy); NotFound if unknown."""
        data = self._load("flow detail", self._join_path(self._flow_path, fd_uuid), fd_uuid)
        fd = models.FlowDetail.from_dict(data)
        if not lazy:
            for ad in self.get_atoms_for_flow(fd_uuid):
                fd.add(ad)
        return fd

    def get_atom_details(self, ad_uuid: str) -> models.AtomDetail:
        """Load an atom detail; NotFound if unknown."""
        data = self._load("atom detail", self._join_path(self._atom_path, ad_uuid), ad_uuid)
        return base.parse_atom(data)

    def get_atoms_for_flow(self, fd_uuid: str) -> Iterator[models.AtomDetail]:
        """Iterate over the atom details of a flow detail."""
        try:
            children = self._get_children(self._join_path(self._flow_path, fd_uuid))
        except exc.NotFound:
            raise exc.NotFound(f"No flow detail found with uuid '{fd_uuid}'")
        for ad_uuid in children:
            yield self.get_atom_details(ad_uuid)

    def destroy_logbook(self, book_uuid: str) -> None:
        """Delete a logbook and everything it contains (NotFound if unknown)."""
        with self._transaction() as txn:
            book_path = self._join_path(self._book_path, book_uuid)
            if not self._exists(book_path):
                raise exc.NotFound(f"No logbook found with uuid '{book_uuid}'")
            for fd_uuid in self._get_children(book_path):
                flow_path = self._join_path(self._flow_path, fd_uuid)
                if self._exists(flow_path):
                    for ad_uuid in self._get_children(flow_path):
                        self._del_tree(self._join_path(self._atom_path, ad_uuid), txn)
                    self._del_tree(flow_path, txn)
            self._del_tree(book_path, txn)

    def destroy_flow_details(self, fd_uuid: str) -> None:
        """Delete a flow detail and its atom details (NotFound if unknown).

        The logbook links go first: a process killed half-way leaves
        unreachable files behind, never a logbook naming a missing flow.
        """
        with self._transaction() as txn:
            flow_path = self._join_path(self._flow_path, fd_uuid)
            if not self._exists(flow_path):
                raise exc.NotFound(f"No flow detail found with uuid '{fd_uuid}'")
            for book_uuid in self._get_children(self._book_path):
                link = self._join_path(self._book_path, book_uuid, fd_uuid)
                if fd_uuid in self._get_children(self._join_path(self._book_path, book_uuid)):
                    self._del_tree(link, txn)
            for ad_uuid in self._get_children(flow_path):
                self._del_tree(self._join_path(self._atom_path, ad_uuid), txn)
            self._del_tree(flow_path, txn)

    def clear_all(self) -> None:
        """Delete every logbook, flow detail and atom detail."""
        with self._transaction() as txn:
            for path in (self._book_path, self._flow_path, self._atom_path):
                self._del_tree(path, txn)
        self.upgrade()

    def upgrade(self) -> None:
        """Create the three top-level directories."""
        for path in (self._book_path, self._flow_path, self._atom_path):
            self._ensure_path(path)

    def validate(self) -> None:
        """Check the three top-level directories exist."""
        for path in (self._book_path, self._flow_path, self._atom_path):
            if not self._exists(path):
                raise exc.StorageFailure(f"Backend path '{path}' is missing (call upgrade)")

    def close(self) -> None:
        """Nothing to release for path-based connections."""
