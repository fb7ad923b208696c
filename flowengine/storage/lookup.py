"""Reading what atoms and injected values hold, for results and argument fetching.

:class:`ResultLookup` answers "what did this atom produce" (its result or
failure, per ``execute``/``revert``) and "where can this symbol be read
from" (flow-level injected containers, atom-scoped injected arguments, a
provider atom's outcome). The public getters and the argument fetchers are
built on these.
"""

from __future__ import annotations

from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.storage.base import META_INJECTED, TRANSIENT, StorageBase

# States in which an atom's ``execute`` outcome may be read (REVERTING keeps it).
EXECUTE_STATES_WITH_RESULTS = frozenset((states.SUCCESS, states.FAILURE, states.REVERTING))
# States in which an atom's ``revert`` outcome may be read.
REVERT_STATES_WITH_RESULTS = frozenset((states.REVERTED, states.REVERT_FAILURE, states.REVERTING))
#: Atom states in which some result may be available.
STATES_WITH_RESULTS = tuple(sorted(EXECUTE_STATES_WITH_RESULTS | REVERT_STATES_WITH_RESULTS))

# Indexing a result the wrong way (missing key, short tuple, None...) raises one of these.
EXTRACTION_EXCEPTIONS = (IndexError, KeyError, ValueError, TypeError)


def item_from(container: Any, index: Any) -> Any:
    """``container[index]``, or the whole container when ``index`` is None."""
    if index is None:
        return container
    return container[index]


class ResultLookup(StorageBase):
    """Read primitives shared by the result getters and the argument fetchers."""

    def _get(self, atom_name: str, revert: bool) -> Any:
        ad = self._detail(atom_name)
        failure = ad.revert_failure if revert else ad.failure
        if failure is not None:
            cached = self._failures.get(atom_name, {}).get(
                states.REVERT if revert else states.EXECUTE
            )
            # The cached object may still carry the traceback the saved one lost.
            if cached is not None and cached is not failure and failure.matches(cached):
                return cached
            return failure
        allowed = REVERT_STATES_WITH_RESULTS if revert else EXECUTE_STATES_WITH_RESULTS
        if ad.state not in allowed:
            what = "revert" if revert else "execution"
            why = " (as it was ignored)" if ad.state == states.IGNORE else ""
            raise exc.NotFound(f"Result for atom '{atom_name}' {what} is not known{why}")
        return ad.revert_results if revert else ad.results

    def _default_container(self, provider: Any) -> Any:
        if provider is TRANSIENT:
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
            raise exc.NotFound(
                f"Expected to be able to find output {symbol!r} produced"
                f" by {provider!r}, but that atom is unknown to storage"
            )
        if ad.failure is not None:
            return True, self._get(provider, False)
        if ad.state in EXECUTE_STATES_WITH_RESULTS:
            try:
                return True, ad.last_results
            except exc.NotFound:
                return False, None
        if ad.state == states.IGNORE:
            return False, None
        raise exc.NotFound(
            f"Expected to be able to find output {symbol!r} produced by"
            f" <Provider '{provider}'> but was unable to get at that providers"
            f" results (it is {ad.state})"
        )

    def _split_providers(self, symbol: str) -> tuple[list[Any], list[tuple[Any, Any]]]:
        defaults, atoms = [], []
        for provider, index in self._reverse_mapping.get(symbol, ()):
            if provider is TRANSIENT or provider == self.injector_name:
                defaults.append((provider, index))
            else:
                atoms.append((provider, index))
        return defaults, atoms

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
