"""Saving atoms' results and failures, reading them back, forgetting them."""

from __future__ import annotations

import logging
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.storage.lookup import EXTRACTION_EXCEPTIONS, ResultLookup
from flowengine.types import failure as ft

LOG = logging.getLogger("flowengine.storage")


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


class ResultsMixin(ResultLookup):
    """Atoms' ``execute``/``revert`` outcomes: saved, read back, listed as failures, reset."""

    #: What a result lacking a declared index/key does. False (TaskFlow's
    #: behaviour): it is stored with a warning, and fetching the missing
    #: symbol raises NotFound. True (engine option ``strict_results``): the
    #: save raises ResultMismatch, so the task fails where the mistake is.
    strict_results = False

    def _check_all_results_provided(self, atom_name: str, result: Any) -> None:
        mapping = self._result_mappings.get(atom_name)
        if not mapping:
            return
        for symbol, index in mapping.items():
            if index is None:
                continue
            try:
                result[index]
            except EXTRACTION_EXCEPTIONS:
                kind = "key" if isinstance(index, str) else "index"
                message = (
                    f"Atom '{atom_name}' declares it provides '{symbol}' at {kind}"
                    f" {index!r} of its result, but the result ({_describe(result)})"
                    f" has no such {kind}"
                )
                if self.strict_results:
                    raise exc.ResultMismatch(message)
                LOG.warning("%s; fetching '%s' will fail", message, symbol)

    def save(self, atom_name: str, result: Any, state: str = states.SUCCESS) -> None:
        """Store the atom's result (or Failure) obtained in ``state`` and persist it.

        With ``strict_results``, raises ResultMismatch (nothing saved) when a
        successful execute result lacks an index or key the atom declared in
        ``save_as``; otherwise that is a logged warning.
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
