"""The state every part of :class:`~flowengine.storage.Storage` shares.

:class:`StorageBase` owns the in-memory models (the flow detail and its atom
details by name), the one cached backend connection they are written
through, the lock, the failure cache and the symbol registry (which provider
produces which symbol, at which index). The mixins in this package add the
public operations on top of it; none of them keeps state of its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.persistence.backends import impl_memory
from flowengine.types import failure as ft

#: The result mapping of a provider that produces nothing (shared, never changed).
_NO_MAPPING: dict[str, Any] = {}


class _TransientProvider:
    """Marker for values injected with ``transient=True`` (never persisted)."""

    def __repr__(self) -> str:
        return "<TransientProvider>"


#: Provider of flow-level values injected with ``transient=True``.
TRANSIENT = _TransientProvider()

#: Atom metadata key holding persistent atom-scoped injected arguments.
META_INJECTED = "injected"


class _StorageLock:
    """TaskFlow-style lock object: ``read_lock()``/``write_lock()`` context managers."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock

    @contextlib.contextmanager
    def read_lock(self) -> Iterator[None]:
        """Hold the storage lock for a consistent multi-step read."""
        with self._lock:
            yield

    write_lock = read_lock


class StorageBase:
    """Shared state and plumbing of a storage (see :class:`~flowengine.storage.Storage`)."""

    #: Name of the special atom detail that holds persistent injected values.
    injector_name = "_TaskFlow_INJECTOR"

    def __init__(
        self,
        flow_detail: models.FlowDetail,
        backend: Any = None,
        scope_fetcher: Callable[[str], Any] | None = None,
    ) -> None:
        self._rlock = threading.RLock()
        self._lock = _StorageLock(self._rlock)
        self._flowdetail = flow_detail
        # Whether atom saves must reach the backend: not for the private one
        # made below, which holds this storage's own detail objects live
        # (registered when they are added to the flow) and nobody else's.
        self._atom_saves = backend is not None
        if backend is None:
            # Most results cannot be deep-copied (locks, clients...), and the
            # in-memory backend exists only for the duration of this storage.
            backend = impl_memory.MemoryBackend.private()
            with contextlib.closing(backend.get_connection()) as conn:
                conn.update_flow_details(flow_detail, ignore_missing=True)
        self._backend = backend
        self._conn: Any = None
        self._scope_fetcher = scope_fetcher or (lambda atom_name: None)
        self._details: dict[str, models.AtomDetail] = {ad.name: ad for ad in flow_detail}
        # provider name -> {symbol: index}; symbol -> [(provider, index), ...]
        self._result_mappings: dict[Any, dict[str, Any]] = {}
        self._reverse_mapping: dict[str, tuple[tuple[Any, Any], ...]] = {}
        # Flow-level injected sources in registration order (injector / transient).
        self._default_sources: list[Any] = []
        self._transients: dict[str, Any] = {}
        self._injected_args: dict[str, dict[str, Any]] = {}
        # atom name -> {EXECUTE|REVERT: Failure}; only atoms that have failures.
        self._failures: dict[str, dict[str, ft.Failure]] = {}
        for ad in self._details.values():
            self._cache_failures(ad)
        injector = self._details.get(self.injector_name)
        if injector is not None and isinstance(injector.results, dict):
            self._set_result_mapping(self.injector_name, {name: name for name in injector.results})

    # Plumbing.

    def _connection(self) -> Any:
        # One connection for this storage's lifetime: writes are serialised
        # by our lock and opening one per write would dominate the cost.
        conn = self._conn
        if conn is None:
            conn = self._conn = self._backend.get_connection()
        return conn

    def _save_atom(self, ad: models.AtomDetail) -> None:
        if self._atom_saves:
            self._connection().update_atom_details(ad)

    def _save_flow(self, new_atoms: Iterable[models.AtomDetail] = ()) -> None:
        # Only the flow detail record and the given atoms are written: the
        # backend keeps atoms it already has (see persistence.base).
        partial = self._flowdetail.copy(retain_contents=False)
        for ad in new_atoms:
            partial.add(ad)
        self._connection().update_flow_details(partial, ignore_missing=True)

    def close(self) -> None:
        """Close the cached backend connection (reopened on next use)."""
        with self._rlock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def _detail(self, atom_name: str) -> models.AtomDetail:
        try:
            return self._details[atom_name]
        except KeyError:
            raise exc.NotFound(f"Unknown atom name '{atom_name}'")

    def _typed_detail(self, atom_name: str, expected: type) -> Any:
        ad = self._detail(atom_name)
        if not isinstance(ad, expected):
            raise TypeError(f"Atom '{atom_name}' is not of the expected type: {expected.__name__}")
        return ad

    def _cache_failures(self, ad: models.AtomDetail) -> None:
        cache = {}
        if ad.failure is not None:
            cache[states.EXECUTE] = ad.failure
        if ad.revert_failure is not None:
            cache[states.REVERT] = ad.revert_failure
        if cache:
            self._failures[ad.name] = cache
        else:
            self._failures.pop(ad.name, None)

    def _set_result_mapping(self, provider: Any, mapping: Mapping[str, Any] | None) -> None:
        """Register that ``provider`` produces ``{symbol: index}`` (index None: whole result)."""
        # Both tables are copied on change, never changed in place: an atom's
        # own save_as dict can then be the table of its provider (most atoms
        # are registered once), and a symbol's entries a tuple.
        known = self._result_mappings.get(provider)
        if not mapping:
            if known is None:
                self._result_mappings[provider] = _NO_MAPPING
            return
        if known:
            merged = dict(known)
            merged.update(mapping)
            self._result_mappings[provider] = merged
        else:
            self._result_mappings[provider] = mapping if type(mapping) is dict else dict(mapping)
        if provider is TRANSIENT or provider == self.injector_name:
            if provider not in self._default_sources:
                self._default_sources.append(provider)
        reverse = self._reverse_mapping
        for symbol, index in mapping.items():
            entry = (provider, index)
            entries = reverse.get(symbol)
            if entries is None:
                reverse[symbol] = (entry,)
            elif entry not in entries:
                reverse[symbol] = (*entries, entry)

    # Identity.

    @property
    def lock(self) -> _StorageLock:
        """Lock object (``read_lock()``/``write_lock()``) guarding this storage."""
        return self._lock

    @property
    def backend(self) -> Any:
        """The backend this storage writes to."""
        return self._backend
