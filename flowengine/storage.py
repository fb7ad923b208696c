"""Storage: the engine's view of one flow detail (states, results, injected values).

Every change is applied to the in-memory models first and then written to
the backend through one cached connection, one atom detail per write, so a
state change or a saved result costs O(1) whatever the flow's size. Nothing
is deep-copied here; without a backend a ``MemoryBackend`` that does not
deep-copy is used.

Threading: every mutation holds ``lock`` (a re-entrant lock). Reads of one
attribute are lock-free; reads that combine several (``fetch_all``, failure
maps, histories) take the lock so listeners on other threads see a
consistent picture.

Fast path for the engine (see :meth:`Storage.fetch_args`): an argument
plan, a tuple of :class:`ArgSpec`, is built once per atom at compile time
from the compiler's providers (:func:`make_arg_plan`); each call then costs
O(number of arguments).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.persistence.backends import impl_memory
from flowengine.types import failure as ft
from flowengine.utils import misc

__all__ = [
    "ArgSpec",
    "META_INJECTED",
    "META_PROGRESS",
    "META_PROGRESS_DETAILS",
    "STATES_WITH_RESULTS",
    "Storage",
    "make_arg_plan",
]

LOG = logging.getLogger(__name__)

# States in which an atom's ``execute`` outcome may be read (REVERTING keeps it).
_EXECUTE_STATES_WITH_RESULTS = frozenset((states.SUCCESS, states.FAILURE, states.REVERTING))
# States in which an atom's ``revert`` outcome may be read.
_REVERT_STATES_WITH_RESULTS = frozenset((states.REVERTED, states.REVERT_FAILURE,
                                         states.REVERTING))
#: Atom states in which some result may be available.
STATES_WITH_RESULTS = tuple(sorted(_EXECUTE_STATES_WITH_RESULTS | _REVERT_STATES_WITH_RESULTS))

#: Atom metadata key holding persistent atom-scoped injected arguments.
META_INJECTED = "injected"
#: Atom metadata keys holding task progress (and its details).
META_PROGRESS = "progress"
META_PROGRESS_DETAILS = "progress_details"

# Indexing a result the wrong way (missing key, short tuple, None...) raises one of these.
_EXTRACTION_EXCEPTIONS = (IndexError, KeyError, ValueError, TypeError)


class _TransientProvider:
    """Marker for values injected with ``transient=True`` (never persisted)."""

    def __repr__(self) -> str:
        return "<TransientProvider>"


_TRANSIENT = _TransientProvider()


class ArgSpec(NamedTuple):
    """How to obtain one argument: ``arg_name <= symbol`` from ``providers``.

    ``providers`` are atom names, closest first, as the compiler resolved
    them; ``optional`` arguments are left out when nothing provides them.
    """

    arg_name: str
    symbol: str
    providers: tuple[str, ...]
    optional: bool


def make_arg_plan(args_mapping: Mapping[str, str],
                  optional_args: Iterable[str] | None,
                  providers_of: Callable[[str], Iterable[str]]) -> tuple[ArgSpec, ...]:
    """Build the plan :meth:`Storage.fetch_args` takes, once per atom and method.

    ``args_mapping`` is ``atom.rebind`` (or ``atom.revert_rebind``),
    ``optional_args`` ``atom.optional`` (or ``revert_optional``) and
    ``providers_of(symbol)`` returns the provider atom names, closest first
    (e.g. ``lambda s: compilation.providers(atom.name, s)``).
    """
    optional = frozenset(optional_args or ())
    return tuple(ArgSpec(arg, symbol, tuple(providers_of(symbol)), arg in optional)
                 for arg, symbol in args_mapping.items())


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


def _item_from(container: Any, index: Any) -> Any:
    if index is None:
        return container
    return container[index]


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(repr, value))}"
    return f"of type {type(value).__name__}"


def _snapshot(ad: models.AtomDetail) -> tuple[Any, ...]:
    """What ``AtomDetail.put`` may change (a retry's history is appended in place)."""
    results = list(ad.results) if isinstance(ad, models.RetryDetail) else ad.results
    return (ad.state, results, ad.failure, ad.revert_results, ad.revert_failure)


def _restore(ad: models.AtomDetail, snapshot: tuple[Any, ...]) -> None:
    (ad.state, ad.results, ad.failure, ad.revert_results, ad.revert_failure) = snapshot


class Storage:
    """Interface between engines and a flow detail (and its backend).

    Atoms are addressed by name. Results are read back through the symbols
    atoms declare (``save_as``), injected values and atom-scoped injected
    arguments, following TaskFlow's precedence rules.
    """

    #: Name of the special atom detail that holds persistent injected values.
    injector_name = "_TaskFlow_INJECTOR"

    def __init__(self, flow_detail: models.FlowDetail, backend: Any = None,
                 scope_fetcher: Callable[[str], Any] | None = None) -> None:
        self._rlock = threading.RLock()
        self._lock = _StorageLock(self._rlock)
        self._flowdetail = flow_detail
        if backend is None:
            # Most results cannot be deep-copied (locks, clients...), and the
            # in-memory backend exists only for the duration of this storage.
            backend = impl_memory.MemoryBackend({"deep_copy": False})
            with contextlib.closing(backend.get_connection()) as conn:
                conn.update_flow_details(flow_detail, ignore_missing=True)
        self._backend = backend
        self._conn: Any = None
        self._scope_fetcher = scope_fetcher or (lambda atom_name: None)
        self._details: dict[str, models.AtomDetail] = {ad.name: ad for ad in flow_detail}
        # provider name -> {symbol: index}; symbol -> [(provider, index), ...]
        self._result_mappings: dict[Any, dict[str, Any]] = {}
        self._reverse_mapping: dict[str, list[tuple[Any, Any]]] = {}
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
            self._set_result_mapping(self.injector_name,
                                     {name: name for name in injector.results})

    # Plumbing.

    def _connection(self) -> Any:
        # One connection for this storage's lifetime: writes are serialised
        # by our lock and opening one per write would dominate the cost.
        conn = self._conn
        if conn is None:
            conn = self._conn = self._backend.get_connection()
        return conn

    def _save_atom(self, ad: models.AtomDetail) -> None:
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

    @staticmethod
    def _detail_class_for(atom: Any) -> type[models.AtomDetail]:
        from flowengine import retry, task

        if isinstance(atom, retry.Retry):
            return models.RetryDetail
        if isinstance(atom, task.BaseTask):
            return models.TaskDetail
        raise TypeError(f"Unknown atom '{atom}' ({type(atom)}) requested to ensure")

    # Identity.

    @property
    def lock(self) -> _StorageLock:
        """Lock object (``read_lock()``/``write_lock()``) guarding this storage."""
        return self._lock

    @property
    def backend(self) -> Any:
        """The backend this storage writes to."""
        return self._backend

    @property
    def flow_name(self) -> str:
        """Name of the flow detail."""
        return self._flowdetail.name

    @property
    def flow_uuid(self) -> str:
        """Uuid of the flow detail."""
        return self._flowdetail.uuid

    @property
    def flow_meta(self) -> dict[str, Any]:
        """Metadata of the flow detail."""
        return self._flowdetail.meta

    # Atoms.

    def ensure_atoms(self, atoms: Iterable[Any]) -> list[str]:
        """Make sure every atom has an atom detail; return their uuids in order.

        Raises TypeError for objects that are not tasks/retries, ValueError
        for an empty name and Duplicate if a detail of another kind has that name.
        """
        with self._rlock:
            uuids: list[str] = []
            created: list[models.AtomDetail] = []
            mappings: list[tuple[str, Any]] = []
            for atom in atoms:
                detail_cls = self._detail_class_for(atom)
                name = atom.name
                if not name:
                    raise ValueError(f"{type(atom).__name__} name must be non-empty")
                ad = self._details.get(name)
                if ad is None:
                    ad = detail_cls(name, models.generate_uuid())
                    ad.state = states.PENDING
                    ad.version = misc.get_version_string(atom)
                    created.append(ad)
                elif not isinstance(ad, detail_cls):
                    raise exc.Duplicate(f"Atom detail '{name}' already exists in flow"
                                        f" detail '{self._flowdetail.name}'")
                uuids.append(ad.uuid)
                mappings.append((name, getattr(atom, "save_as", None)))
            if created:
                self._save_flow(created)
                for ad in created:
                    self._flowdetail.add(ad)
                    self._details[ad.name] = ad
            for name, save_as in mappings:
                self._set_result_mapping(name, save_as)
            return uuids

    def ensure_atom(self, atom: Any) -> str:
        """Make sure the atom has an atom detail; return its uuid."""
        return self.ensure_atoms([atom])[0]

    def get_atom_uuid(self, atom_name: str) -> str:
        """Uuid of the named atom's detail (NotFound if unknown)."""
        return self._detail(atom_name).uuid

    def set_atom_state(self, atom_name: str, state: str) -> None:
        """Set and persist the atom's state."""
        with self._rlock:
            ad = self._detail(atom_name)
            if ad.state != state:
                ad.state = state
                self._save_atom(ad)

    def get_atom_state(self, atom_name: str) -> str | None:
        """The atom's state (NotFound if unknown)."""
        return self._detail(atom_name).state

    def set_atom_intention(self, atom_name: str, intention: str) -> None:
        """Set and persist the atom's intention."""
        with self._rlock:
            ad = self._detail(atom_name)
            if ad.intention != intention:
                ad.intention = intention
                self._save_atom(ad)

    def get_atom_intention(self, atom_name: str) -> str:
        """The atom's intention (NotFound if unknown)."""
        return self._detail(atom_name).intention

    def get_atoms_states(self, atom_names: Iterable[str]) -> dict[str, tuple[Any, str]]:
        """Map each name to ``(state, intention)``."""
        with self._rlock:
            out = {}
            for name in atom_names:
                ad = self._detail(name)
                out[name] = (ad.state, ad.intention)
            return out

    def update_atom_metadata(self, atom_name: str,
                             update_with: Mapping[str, Any] | Iterable[Any]) -> None:
        """Merge a dict (or key/value pairs) into the atom's metadata and persist it."""
        with self._rlock:
            ad = self._detail(atom_name)
            update_with = dict(update_with) if update_with else {}
            if update_with:
                ad.meta.update(update_with)
                self._save_atom(ad)

    def set_task_progress(self, task_name: str, progress: float,
                          details: Mapping[str, Any] | None = None) -> None:
        """Record a task's progress (0.0-1.0) and optional progress details."""
        with self._rlock:
            ad = self._typed_detail(task_name, models.TaskDetail)
            ad.meta[META_PROGRESS] = progress
            if details is not None:
                # Details remember the progress they were reported at.
                ad.meta[META_PROGRESS_DETAILS] = (
                    {"at_progress": progress, "details": details} if details else None)
            self._save_atom(ad)

    def get_task_progress(self, task_name: str) -> float:
        """The task's last recorded progress (0.0 if none)."""
        return self._typed_detail(task_name, models.TaskDetail).meta.get(META_PROGRESS, 0.0)

    def get_task_progress_details(self, task_name: str) -> dict[str, Any] | None:
        """The task's last progress details (``{'at_progress', 'details'}``) or None."""
        ad = self._typed_detail(task_name, models.TaskDetail)
        return ad.meta.get(META_PROGRESS_DETAILS)

    # Results.

    def _check_all_results_provided(self, atom_name: str, result: Any) -> None:
        mapping = self._result_mappings.get(atom_name)
        if not mapping:
            return
        for symbol, index in mapping.items():
            if index is None:
                continue
            try:
                result[index]
            except _EXTRACTION_EXCEPTIONS:
                kind = "key" if isinstance(index, str) else "index"
                raise exc.ResultMismatch(
                    f"Atom '{atom_name}' declares it provides '{symbol}' at {kind} {index!r}"
                    f" of its result, but the result ({_describe(result)}) has no such {kind}")

    def save(self, atom_name: str, result: Any, state: str = states.SUCCESS) -> None:
        """Store the atom's result (or Failure) obtained in ``state`` and persist it.

        Raises ResultMismatch (nothing saved) when a successful execute result
        lacks an index or key the atom declared in ``save_as``.
        """
        with self._rlock:
            ad = self._detail(atom_name)
            is_failure = isinstance(result, ft.Failure)
            if state == states.SUCCESS and not is_failure and ad.intention == states.EXECUTE:
                self._check_all_results_provided(atom_name, result)
            before = _snapshot(ad)
            if ad.put(state, result):
                try:
                    self._save_atom(ad)
                except exc.SerializationFailure:
                    # The backend refused the value before writing anything:
                    # keep memory equal to what is stored, let the caller
                    # record this as the atom's failure.
                    _restore(ad, before)
                    raise
            if is_failure and state in (states.FAILURE, states.REVERT_FAILURE):
                key = states.EXECUTE if state == states.FAILURE else states.REVERT
                self._failures.setdefault(atom_name, {})[key] = result
            elif self._failures.get(atom_name):
                self._cache_failures(ad)

    def save_retry_failure(self, retry_name: str, failed_atom_name: str,
                           failure: ft.Failure) -> None:
        """Add an atom's failure to the retry's latest history entry."""
        with self._rlock:
            ad = self._typed_detail(retry_name, models.RetryDetail)
            try:
                failures = ad.last_failures
            except exc.NotFound:
                exc.raise_with_cause(exc.StorageFailure,
                                     "Unable to fetch most recent retry failures so new"
                                     " retry failure can be inserted")
            if failed_atom_name not in failures:
                failures[failed_atom_name] = failure
                self._save_atom(ad)

    def cleanup_retry_history(self, retry_name: str, state: str) -> None:
        """Empty the retry's history and set its state."""
        with self._rlock:
            ad = self._typed_detail(retry_name, models.RetryDetail)
            ad.state = state
            ad.results = []
            self._save_atom(ad)

    def _get(self, atom_name: str, revert: bool) -> Any:
        ad = self._detail(atom_name)
        failure = ad.revert_failure if revert else ad.failure
        if failure is not None:
            cached = self._failures.get(atom_name, {}).get(
                states.REVERT if revert else states.EXECUTE)
            # The cached object may still carry the traceback the saved one lost.
            if cached is not None and cached is not failure and failure.matches(cached):
                return cached
            return failure
        allowed = _REVERT_STATES_WITH_RESULTS if revert else _EXECUTE_STATES_WITH_RESULTS
        if ad.state not in allowed:
            what = "revert" if revert else "execution"
            why = " (as it was ignored)" if ad.state == states.IGNORE else ""
            raise exc.NotFound(f"Result for atom '{atom_name}' {what} is not known{why}")
        return ad.revert_results if revert else ad.results

    def get_execute_result(self, atom_name: str) -> Any:
        """The atom's ``execute`` result or Failure (NotFound if not available)."""
        return self._get(atom_name, False)

    def get_revert_result(self, atom_name: str) -> Any:
        """The atom's ``revert`` result or Failure (NotFound if not available)."""
        return self._get(atom_name, True)

    #: TaskFlow's older names.
    get = get_execute_result

    def _get_failures(self, key: str) -> dict[str, ft.Failure]:
        with self._rlock:
            return {name: cache[key] for name, cache in self._failures.items() if key in cache}

    def get_execute_failures(self) -> dict[str, ft.Failure]:
        """Map atom name -> Failure for every ``execute`` failure."""
        return self._get_failures(states.EXECUTE)

    get_failures = get_execute_failures

    def get_revert_failures(self) -> dict[str, ft.Failure]:
        """Map atom name -> Failure for every ``revert`` failure."""
        return self._get_failures(states.REVERT)

    def has_failures(self) -> bool:
        """Whether any atom has an execute or revert failure."""
        return bool(self._failures)

    def reset(self, atom_name: str, state: str = states.PENDING) -> None:
        """Forget the atom's results and failures and set ``state`` (unless already in it)."""
        if atom_name == self.injector_name:
            return
        with self._rlock:
            ad = self._detail(atom_name)
            if ad.state == state:
                return
            ad.reset(state)
            self._save_atom(ad)
            self._failures.pop(atom_name, None)

    def reset_atoms(self, atom_names: Iterable[str], state: str = states.PENDING,
                    intention: str = states.EXECUTE) -> None:
        """Set state and intention of many atoms (one write per changed atom)."""
        with self._rlock:
            for name in atom_names:
                ad = self._detail(name)
                if ad.state != state or ad.intention != intention:
                    ad.state = state
                    ad.intention = intention
                    self._save_atom(ad)

    # Injection.

    def inject_atom_args(self, atom_name: str, pairs: Mapping[str, Any] | Iterable[Any],
                         transient: bool = True) -> None:
        """Give one atom arguments (by symbol) that take precedence over everything else.

        Transient ones live in memory only; persistent ones go to the atom's
        metadata (``META_INJECTED``) and should be JSON-serialisable.
        """
        with self._rlock:
            ad = self._detail(atom_name)
            pairs = dict(pairs)
            if transient:
                self._injected_args.setdefault(atom_name, {}).update(pairs)
            else:
                injected = dict(ad.meta.get(META_INJECTED) or {})
                injected.update(pairs)
                ad.meta[META_INJECTED] = injected
                self._save_atom(ad)

    def inject(self, pairs: Mapping[str, Any] | Iterable[Any], transient: bool = False) -> None:
        """Add flow-level values (requirements no atom provides).

        Persistent values are stored in the special injector atom detail;
        transient ones only in memory (for objects that cannot be saved).
        """
        with self._rlock:
            pairs = dict(pairs)
            if transient:
                self._transients.update(pairs)
                provider: Any = _TRANSIENT
                names: Iterable[str] = list(self._transients)
            else:
                ad = self._details.get(self.injector_name)
                if ad is None:
                    ad = models.TaskDetail(self.injector_name, models.generate_uuid())
                    ad.state = states.SUCCESS
                    ad.results = pairs
                    self._save_flow([ad])
                    self._flowdetail.add(ad)
                    self._details[ad.name] = ad
                else:
                    old_results = ad.results
                    ad.results = dict(old_results) if isinstance(old_results, dict) else {}
                    ad.results.update(pairs)
                    try:
                        self._save_atom(ad)
                    except exc.SerializationFailure:
                        ad.results = old_results  # nothing was stored
                        raise
                provider = self.injector_name
                names = list(ad.results)
            self._set_result_mapping(provider, {name: name for name in names})

    def _set_result_mapping(self, provider: Any, mapping: Mapping[str, Any] | None) -> None:
        provider_mapping = self._result_mappings.setdefault(provider, {})
        if not mapping:
            return
        provider_mapping.update(mapping)
        if provider is _TRANSIENT or provider == self.injector_name:
            if provider not in self._default_sources:
                self._default_sources.append(provider)
        for symbol, index in mapping.items():
            entries = self._reverse_mapping.setdefault(symbol, [])
            entry = (provider, index)
            if entry not in entries:
                entries.append(entry)

    # Fetching.

    def _default_container(self, provider: Any) -> Any:
        if provider is _TRANSIENT:
            return self._transients
        ad = self._details.get(self.injector_name)
        # Foreign/old data may hold a non-dict injector result: treat as empty.
        if ad is None or not isinstance(ad.results, dict):
            return {}
        return ad.results

    def _provider_container(self, provider: str, symbol: str) -> tuple[bool, Any]:
        """(usable, container) of an atom provider's execute outcome.

        Not usable when the provider was ignored; NotFound when it has not
        produced anything yet.
        """
        ad = self._details.get(provider)
        if ad is None:
            raise exc.NotFound(f"Expected to be able to find output {symbol!r} produced"
                               f" by {provider!r}, but that atom is unknown to storage")
        if ad.failure is not None:
            return True, self._get(provider, False)
        if ad.state in _EXECUTE_STATES_WITH_RESULTS:
            try:
                return True, ad.last_results
            except exc.NotFound:
                return False, None
        if ad.state == states.IGNORE:
            return False, None
        raise exc.NotFound(f"Expected to be able to find output {symbol!r} produced by"
                           f" <Provider '{provider}'> but was unable to get at that providers"
                           f" results (it is {ad.state})")

    def _split_providers(self, symbol: str) -> tuple[list[Any], list[tuple[Any, Any]]]:
        defaults, atoms = [], []
        for provider, index in self._reverse_mapping.get(symbol, ()):
            if provider is _TRANSIENT or provider == self.injector_name:
                defaults.append((provider, index))
            else:
                atoms.append((provider, index))
        return defaults, atoms

    def fetch(self, name: str, many_handler: Callable[[list[Any]], Any] | None = None) -> Any:
        """Value of a symbol; with several providers ``many_handler`` picks (default: first).

        Raises NotFound when no provider is known or none has produced it.
        """
        with self._rlock:
            if name not in self._reverse_mapping:
                raise exc.NotFound(f"Name {name!r} is not mapped as a produced output by any"
                                   " providers")
            defaults, atoms = self._split_providers(name)
            values = []
            for provider, index in defaults:
                try:
                    values.append(_item_from(self._default_container(provider), index))
                except _EXTRACTION_EXCEPTIONS:
                    pass
            for provider, index in atoms:
                usable, container = self._provider_container(provider, name)
                if not usable:
                    continue
                try:
                    values.append(_item_from(container, index))
                except _EXTRACTION_EXCEPTIONS:
                    exc.raise_with_cause(
                        exc.NotFound, f"Unable to find result {name!r}, expected to be able to find"
                        f" it created by <Provider '{provider}' @ index {index!r}> but was"
                        " unable to perform successful extraction")
            if not values:
                raise exc.NotFound(f"Unable to find result {name!r}, searched"
                                   f" {len(defaults) + len(atoms)} providers")
            return many_handler(values) if many_handler is not None else values[0]

    def fetch_all(self, many_handler: Callable[[list[Any]], Any] | None = None) -> dict[str, Any]:
        """Every symbol that currently has a value (several values -> a list by default)."""
        if many_handler is None:
            def many_handler(values: list[Any]) -> Any:
                return values if len(values) > 1 else values[0]
        with self._rlock:
            results = {}
            for name in list(self._reverse_mapping):
                try:
                    results[name] = self.fetch(name, many_handler=many_handler)
                except exc.NotFound:
                    pass
            return results

    def _scope_levels(self, atom_name: str | None, scope_walker: Any,
                      atom_providers: list[tuple[Any, Any]]) -> list[list[str]]:
        if scope_walker is None and atom_name:
            scope_walker = self._scope_fetcher(atom_name)
        if scope_walker is None:
            # No scoping known: every registered provider is one (latest-last) level.
            return [[p for p, _ in atom_providers]]
        return [list(level) for level in scope_walker]

    def _injected_sources(self, atom_name: str | None) -> list[dict[str, Any]]:
        if not atom_name:
            return []
        ad = self._detail(atom_name)
        sources = []
        transient = self._injected_args.get(atom_name)
        if transient:
            sources.append(transient)
        persistent = ad.meta.get(META_INJECTED)
        if persistent:
            sources.append(persistent)
        return sources

    def fetch_mapped_args(self, args_mapping: Mapping[str, str], atom_name: str | None = None,
                          scope_walker: Any = None,
                          optional_args: Iterable[str] | None = None) -> dict[str, Any]:
        """Arguments ``{arg_name: value}`` for ``args_mapping`` (``{arg_name: symbol}``).

        Precedence: atom-scoped injected values, flow-level injected values,
        then the closest accessible atom provider (per ``scope_walker``, an
        iterable of levels of atom names, closest first). Raises NotFound
        for a required argument nothing provides.
        """
        optional = frozenset(optional_args or ())
        with self._rlock:
            injected = self._injected_sources(atom_name)
            if not args_mapping:
                return {}
            walker_levels: list[list[str]] | None = None
            mapped = {}
            for arg_name, symbol in args_mapping.items():
                for source in injected:
                    if symbol in source:
                        mapped[arg_name] = source[symbol]
                        break
                else:
                    if symbol not in self._reverse_mapping:
                        if arg_name in optional:
                            continue
                        raise exc.NotFound(f"Name {symbol!r} is not mapped as a produced output by"
                                           " any providers")
                    defaults, atoms = self._split_providers(symbol)
                    if defaults:
                        provider, index = defaults[0]
                        try:
                            mapped[arg_name] = _item_from(self._default_container(provider),
                                                          index)
                        except _EXTRACTION_EXCEPTIONS:
                            exc.raise_with_cause(exc.NotFound, "Unable to find injected"
                                                 f" value {symbol!r}")
                        continue
                    if walker_levels is None:
                        walker_levels = self._scope_levels(atom_name, scope_walker, atoms)
                    found, value = self._from_atom_levels(symbol, atoms, walker_levels)
                    if not found:
                        raise exc.NotFound(f"Mapped argument {arg_name!r} <= {symbol!r} was not"
                                           " produced by any accessible provider"
                                           f" ({len(atoms)} possible providers were scanned)")
                    mapped[arg_name] = value
            return mapped

    def _from_atom_levels(self, symbol: str, atoms: list[tuple[Any, Any]],
                          levels: list[list[str]]) -> tuple[bool, Any]:
        by_name = dict(atoms)
        for level in levels:
            candidates = [(p, by_name[p]) for p in level if p in by_name]
            level_had_results = False
            for provider, index in candidates:
                usable, container = self._provider_container(provider, symbol)
                if not usable:
                    continue
                level_had_results = True
                try:
                    return True, _item_from(container, index)
                except _EXTRACTION_EXCEPTIONS:
                    pass
            if level_had_results:
                names = [p for p, _ in candidates]
                raise exc.NotFound(f"Unable to find result {symbol!r}, expected to be able to"
                                   f" find it created by one of {names} but was unable to"
                                   " perform successful extraction")
        return False, None

    def fetch_args(self, atom_name: str, plan: Iterable[ArgSpec]) -> dict[str, Any]:
        """Engine fast path: arguments for ``atom_name`` from a precomputed plan.

        Same precedence as :meth:`fetch_mapped_args`, but providers come
        from the plan (compile-time resolution), so each call is
        O(arguments). Raises NotFound for a required argument that is
        unavailable.
        """
        if not plan:
            return {}
        details = self._details
        mappings = self._result_mappings
        local = self._injected_args.get(atom_name)
        persistent = details[atom_name].meta.get(META_INJECTED) if atom_name in details else None
        defaults = self._default_sources
        out = {}
        for arg_name, symbol, providers, optional in plan:
            if local and symbol in local:
                out[arg_name] = local[symbol]
                continue
            if persistent and symbol in persistent:
                out[arg_name] = persistent[symbol]
                continue
            found = False
            for source in defaults:
                container = self._default_container(source)
                if symbol in container:
                    out[arg_name] = container[symbol]
                    found = True
                    break
            if found:
                continue
            for provider in providers:
                usable, container = self._provider_container(provider, symbol)
                if not usable:
                    continue
                try:
                    out[arg_name] = _item_from(container, mappings[provider][symbol])
                except _EXTRACTION_EXCEPTIONS:
                    continue
                found = True
                break
            if not found and not optional:
                raise exc.NotFound(f"Mapped argument {arg_name!r} <= {symbol!r} was not produced"
                                   " by any accessible provider"
                                   f" ({len(providers)} possible providers were scanned)")
        return out

    def fetch_unsatisfied_args(self, atom_name: str, args_mapping: Mapping[str, str],
                               scope_walker: Any = None,
                               optional_args: Iterable[str] | None = None) -> set[str]:
        """Argument names nothing can provide (injected values or registered providers).

        Only checks that providers exist in scope, not that they have run.
        """
        optional = frozenset(optional_args or ())
        with self._rlock:
            injected = self._injected_sources(atom_name)
            missing = set()
            walker_levels: list[list[str]] | None = None
            for arg_name, symbol in args_mapping.items():
                if arg_name in optional or any(symbol in src for src in injected):
                    continue
                defaults, atoms = self._split_providers(symbol)
                if defaults:
                    continue
                if atoms:
                    if walker_levels is None:
                        walker_levels = self._scope_levels(atom_name, scope_walker, atoms)
                    names = {p for p, _ in atoms}
                    if any(p in names for level in walker_levels for p in level):
                        continue
                missing.add(arg_name)
            return missing

    def unsatisfied_args(self, atom_name: str, plan: Iterable[ArgSpec]) -> set[str]:
        """Fast-path twin of :meth:`fetch_unsatisfied_args` for a plan (see ``fetch_args``)."""
        with self._rlock:
            injected = self._injected_sources(atom_name)
            missing = set()
            for arg_name, symbol, providers, optional in plan:
                if optional or providers or any(symbol in src for src in injected):
                    continue
                if any(symbol in self._default_container(s) for s in self._default_sources):
                    continue
                missing.add(arg_name)
            return missing

    # Flow.

    def set_flow_state(self, state: str) -> None:
        """Set and persist the flow detail's state."""
        with self._rlock:
            self._flowdetail.state = state
            self._save_flow()

    def get_flow_state(self) -> str:
        """The flow detail's state (PENDING if never set)."""
        return self._flowdetail.state or states.PENDING

    def change_flow_state(self, state: str) -> tuple[bool, str]:
        """Move the flow to ``state`` if allowed: ``(changed, old_state)``; raises InvalidState."""
        with self._rlock:
            old_state = self.get_flow_state()
            if not states.check_flow_transition(old_state, state):
                return False, old_state
            self.set_flow_state(state)
            return True, old_state

    def update_flow_metadata(self, update_with: Mapping[str, Any]) -> None:
        """Merge into the flow detail's metadata and persist it."""
        with self._rlock:
            if update_with:
                self._flowdetail.meta.update(update_with)
                self._save_flow()

    # Retries.

    def _history(self, ad: models.RetryDetail) -> Any:
        from flowengine import retry

        failure = ad.failure
        if failure is not None:
            cached = self._failures.get(ad.name, {}).get(states.EXECUTE)
            if cached is not None and failure.matches(cached):
                failure = cached
        return retry.History(list(ad.results), failure=failure)

    def get_retry_history(self, retry_name: str) -> Any:
        """The retry's History (its attempts and the failures seen in each)."""
        with self._rlock:
            return self._history(self._typed_detail(retry_name, models.RetryDetail))

    def get_retry_histories(self) -> list[tuple[str, Any]]:
        """``(name, History)`` for every retry."""
        with self._rlock:
            return [(ad.name, self._history(ad)) for ad in self._details.values()
                    if isinstance(ad, models.RetryDetail)]
