"""Fenced persistence: once a newer claim took a job, the older claimer's writes are refused.

Why here and not in the conductor: a conductor paused past its lease (a
SIGSTOP, a long GC, a network partition) wakes up with an engine that still
believes it owns the job. Asking the jobboard "is my lease alive?" before
each save cannot help, because the pause can fall between the question and
the save. The only safe check is one the *persistence backend* makes in the
same atomic step as the write.

So each flow detail a job runs has a *fence*: the highest fencing token
(:mod:`flowengine.jobs.base`) that has claimed it. A conductor that claims
the job first **advances** the fence to its token (refused with
:class:`~flowengine.exceptions.FencedOut` if a newer one is already there),
then loads the flow detail and runs it through a :class:`FencedBackend`,
whose every write passes only while the stored fence is not above its token,
checked atomically with the write: under the memory backend's lock, under
the directory backend's exclusive ``flock``, and in the SQL backend's own
write transaction (the fence row read ``FOR UPDATE``). From the moment the
next claimer advances the fence, every write of the old one fails with
FencedOut, however long it slept; writes it made before that are seen by
the new claimer, which loads the flow detail after advancing. Tokens grow
across the whole board, so a flow detail reposted in a new job is fenced
correctly too.

A backend supports fencing by providing ``fenced_connection(fence)`` on its
backend object; :func:`supports_fencing` tells.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from flowengine import exceptions as exc
from flowengine.persistence import base, models

if TYPE_CHECKING:  # path_based builds PathFencedConnection
    from flowengine.persistence.path_based import PathBasedConnection

_T = TypeVar("_T")

__all__ = ["FENCES_DIR", "Fence", "FencedBackend", "PathFencedConnection", "supports_fencing"]

#: Directory (path-based backends) holding one item per fence.
FENCES_DIR = "fences"


@dataclass(frozen=True)
class Fence:
    """Writes to ``name`` (a flow detail uuid) are allowed up to claim ``token``."""

    name: str
    token: int

    def check(self, stored: int | None) -> None:
        """FencedOut unless ``stored`` (the backend's fence value) allows our token."""
        if stored is not None and stored > self.token:
            raise exc.FencedOut(
                f"Write to flow detail {self.name} refused: claim {self.token}"
                f" was superseded by claim {stored} (this conductor lost"
                f" the job while paused or cut off)"
            )


class FencingBackend(Protocol):
    """A backend that can check a fence atomically with its writes."""

    def fenced_connection(self, fence: Fence) -> base.Connection:
        """A connection whose writes are refused once ``fence`` is superseded."""


def _root_of(conn: PathBasedConnection) -> str:
    path = conn.backend.path
    if path is None:  # path-based backends refuse to be built without one
        raise exc.StorageFailure("a path-based backend without a base path cannot fence")
    return path


def supports_fencing(backend: Any) -> bool:
    """Whether ``backend`` can check a fence atomically with its writes."""
    return callable(getattr(backend, "fenced_connection", None))


class FencedBackend(base.Backend):
    """A view of ``backend`` whose writes are refused once ``fence`` is superseded.

    Not the owner of ``backend``: close() leaves it open. TypeError if the
    backend does not support fencing.
    """

    def __init__(self, backend: base.Backend, fence: Fence) -> None:
        if not supports_fencing(backend):
            raise TypeError(f"{type(backend).__name__} cannot fence writes")
        super().__init__(backend.conf)
        self._backend = backend
        self._fencing: FencingBackend = backend  # type: ignore[assignment]  # checked above
        self.fence = fence

    @property
    def wrapped(self) -> base.Backend:
        """The backend writes go to."""
        return self._backend

    def get_connection(self) -> base.Connection:
        """A connection whose writes check the fence atomically."""
        return self._fencing.fenced_connection(self.fence)

    def advance(self) -> None:
        """Raise the stored fence to our token (FencedOut if a newer claim is there)."""
        with contextlib.closing(self.get_connection()) as conn:
            conn.advance_fence()  # type: ignore[attr-defined]

    def close(self) -> None:
        """Nothing: the wrapped backend belongs to the caller."""


class PathFencedConnection(base.Connection):
    """Fencing for path-based backends (memory, dir): check and write under one lock.

    ``conn`` must hold an exclusive, re-entrant lock in ``_transaction()``.
    """

    def __init__(self, conn: PathBasedConnection, fence: Fence) -> None:
        self._conn = conn
        self._fence = fence
        self._root = _root_of(conn)
        self._path = conn._join_path(self._root, FENCES_DIR, fence.name)

    @property
    def backend(self) -> base.Backend:
        """The backend of the wrapped connection."""
        return self._conn.backend

    def _stored(self) -> int | None:
        try:
            return int(self._conn._get_item(self._path)["token"])
        except exc.NotFound:
            return None
        except (KeyError, TypeError, ValueError) as e:
            raise exc.StorageFailure(f"Fence {self._path} is unreadable: {e}") from e

    @contextlib.contextmanager
    def _fenced(self) -> Iterator[Any]:
        with self._conn._transaction() as txn:
            self._fence.check(self._stored())
            yield txn

    def advance_fence(self) -> None:
        """Raise the fence to our token, atomically (FencedOut if it is above)."""
        with self._fenced() as txn:
            self._conn._ensure_path(self._conn._join_path(self._root, FENCES_DIR))
            self._conn._set_item(self._path, {"token": self._fence.token}, txn)

    def _write(self, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        with self._fenced():
            return method(*args, **kwargs)

    def update_atom_details(
        self, atom_detail: models.AtomDetail, ignore_missing: bool = False
    ) -> models.AtomDetail:
        """Save an atom detail if the fence still allows our token."""
        return self._write(self._conn.update_atom_details, atom_detail, ignore_missing)

    def update_flow_details(
        self, flow_detail: models.FlowDetail, ignore_missing: bool = False
    ) -> models.FlowDetail:
        """Save a flow detail if the fence still allows our token."""
        return self._write(self._conn.update_flow_details, flow_detail, ignore_missing)

    def save_logbook(self, book: models.LogBook) -> models.LogBook:
        """Save a logbook if the fence still allows our token."""
        return self._write(self._conn.save_logbook, book)

    def destroy_logbook(self, book_uuid: str) -> None:
        """Delete a logbook if the fence still allows our token."""
        self._write(self._conn.destroy_logbook, book_uuid)

    def clear_all(self) -> None:
        """Delete everything if the fence still allows our token."""
        self._write(self._conn.clear_all)

    # Reads, and the rest, go straight through.

    def close(self) -> None:
        """Close the wrapped connection."""
        self._conn.close()

    def validate(self) -> None:
        """Validate the wrapped connection."""
        self._conn.validate()

    def upgrade(self) -> None:
        """Upgrade the wrapped connection."""
        self._conn.upgrade()

    def get_logbook(self, book_uuid: str, lazy: bool = False) -> models.LogBook:
        """Load a logbook."""
        return self._conn.get_logbook(book_uuid, lazy=lazy)

    def get_logbooks(self, lazy: bool = False) -> Any:
        """Every logbook."""
        return self._conn.get_logbooks(lazy=lazy)

    def get_flows_for_book(self, book_uuid: str, lazy: bool = False) -> Any:
        """The flow details of a logbook."""
        return self._conn.get_flows_for_book(book_uuid, lazy=lazy)

    def get_flow_details(self, fd_uuid: str, lazy: bool = False) -> models.FlowDetail:
        """Load a flow detail."""
        return self._conn.get_flow_details(fd_uuid, lazy=lazy)

    def get_atom_details(self, ad_uuid: str) -> models.AtomDetail:
        """Load an atom detail."""
        return self._conn.get_atom_details(ad_uuid)

    def get_atoms_for_flow(self, fd_uuid: str) -> Any:
        """The atom details of a flow detail."""
        return self._conn.get_atoms_for_flow(fd_uuid)
