"""The interface every persistence backend implements (memory, dir, sqlalchemy...).

A backend is built from a configuration dict and hands out connections;
a connection saves and loads the models of :mod:`flowengine.persistence.models`.

Rules every backend follows (storage relies on them):

* ``update_*``/``save_logbook`` create or update: contained children that
  are *present* in the given object are written, children stored earlier
  but absent from it are left alone (so a caller may pass a copy holding
  only what changed).
* They return the object as now stored (it may be the given one).
* A connection may be used for many sequential calls; it is closed once.
* Anything that goes wrong inside the backend surfaces as
  ``exceptions.StorageFailure`` (``NotFound`` for a missing uuid).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

from flowengine import exceptions as exc
from flowengine.persistence import models

__all__ = ["Backend", "Connection", "format_atom", "parse_atom"]


class Backend(abc.ABC):
    """A persistence backend: configuration plus a factory of connections."""

    def __init__(self, conf: dict[str, Any] | None = None) -> None:
        self._conf = dict(conf) if conf else {}

    @property
    def conf(self) -> dict[str, Any]:
        """The configuration this backend was built with."""
        return self._conf

    @abc.abstractmethod
    def get_connection(self) -> Connection:
        """Return a new connection to this backend."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release whatever the backend holds (connections, files...)."""


class Connection(abc.ABC):
    """One connection to a backend: save, load and delete logbooks and details."""

    @property
    @abc.abstractmethod
    def backend(self) -> Backend:
        """The backend this connection belongs to."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close this connection."""

    @abc.abstractmethod
    def validate(self) -> None:
        """Check the backend is reachable and usable; raise StorageFailure if not."""

    @abc.abstractmethod
    def upgrade(self) -> None:
        """Create or migrate whatever structure the backend needs."""

    @abc.abstractmethod
    def clear_all(self) -> None:
        """Delete every logbook, flow detail and atom detail."""

    @abc.abstractmethod
    def update_atom_details(
        self, atom_detail: models.AtomDetail, ignore_missing: bool = False
    ) -> models.AtomDetail:
        """Save an existing atom detail (NotFound if unknown, unless ignore_missing)."""

    @abc.abstractmethod
    def update_flow_details(
        self, flow_detail: models.FlowDetail, ignore_missing: bool = False
    ) -> models.FlowDetail:
        """Save a flow detail and the atom details it contains."""

    @abc.abstractmethod
    def save_logbook(self, book: models.LogBook) -> models.LogBook:
        """Create or update a logbook with the flow (and atom) details it contains."""

    @abc.abstractmethod
    def destroy_logbook(self, book_uuid: str) -> None:
        """Delete a logbook and everything it contains (NotFound if unknown)."""

    def destroy_flow_details(self, fd_uuid: str) -> None:
        """Delete a flow detail and its atom details, wherever it is (NotFound if unknown).

        Not in TaskFlow's interface: a backend written for it raises
        flowengine's NotImplementedError naming itself.
        """
        raise exc.NotImplementedError(
            f"{type(self.backend).__name__} cannot delete a"
            " single flow detail (destroy_flow_details)"
        )

    @abc.abstractmethod
    def get_logbook(self, book_uuid: str, lazy: bool = False) -> models.LogBook:
        """Load a logbook (with its flow details unless lazy); NotFound if unknown."""

    @abc.abstractmethod
    def get_logbooks(self, lazy: bool = False) -> Iterable[models.LogBook]:
        """Iterate over every stored logbook."""

    @abc.abstractmethod
    def get_flows_for_book(self, book_uuid: str, lazy: bool = False) -> Iterable[models.FlowDetail]:
        """Iterate over the flow details of a logbook."""

    @abc.abstractmethod
    def get_flow_details(self, fd_uuid: str, lazy: bool = False) -> models.FlowDetail:
        """Load a flow detail (with its atom details unless lazy); NotFound if unknown."""

    @abc.abstractmethod
    def get_atom_details(self, ad_uuid: str) -> models.AtomDetail:
        """Load an atom detail; NotFound if unknown."""

    @abc.abstractmethod
    def get_atoms_for_flow(self, fd_uuid: str) -> Iterable[models.AtomDetail]:
        """Iterate over the atom details of a flow detail."""

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def format_atom(atom_detail: models.AtomDetail) -> dict[str, Any]:
    """Return the stored form of an atom detail: its type name and its dict."""
    return {
        "atom": atom_detail.to_dict(),
        "type": models.atom_detail_type(atom_detail),
    }


def parse_atom(data: Any) -> models.AtomDetail:
    """Inverse of ``format_atom``; raises InvalidFormat naming what is wrong."""
    if not isinstance(data, dict) or "atom" not in data or "type" not in data:
        raise exc.InvalidFormat(
            f"Stored atom detail must be a dict with 'atom' and 'type' keys, not {data!r}"
        )
    try:
        cls = models.atom_detail_class(data["type"])
    except TypeError as e:
        raise exc.InvalidFormat(str(e), cause=e)
    return cls.from_dict(data["atom"])
