"""Reading symbols by name: ``fetch``, ``fetch_all`` and scope-walked argument mapping.

This is the general path, for callers that hold an ``args_mapping`` and
maybe a scope walker; the engine's per-call path is in
:mod:`flowengine.storage.plans`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.storage.lookup import EXTRACTION_EXCEPTIONS, ResultLookup, item_from


class FetchingMixin(ResultLookup):
    """Values of symbols, and of atoms' arguments resolved through their scope."""

    def fetch(self, name: str, many_handler: Callable[[list[Any]], Any] | None = None) -> Any:
        """Value of a symbol; with several providers ``many_handler`` picks (default: first).

        Raises NotFound when no provider is known or none has produced it.
        """
        with self._rlock:
            if name not in self._reverse_mapping:
                raise exc.NotFound(
                    f"Name {name!r} is not mapped as a produced output by any providers"
                )
            defaults, atoms = self._split_providers(name)
            values = []
            for provider, index in defaults:
                try:
                    values.append(item_from(self._default_container(provider), index))
                except EXTRACTION_EXCEPTIONS:
                    pass
            for provider, index in atoms:
                usable, container = self._provider_container(provider, name)
                if not usable:
                    continue
                try:
                    values.append(item_from(container, index))
                except EXTRACTION_EXCEPTIONS:
                    exc.raise_with_cause(
                        exc.NotFound,
                        f"Unable to find result {name!r}, expected to be able to find"
                        f" it created by <Provider '{provider}' @ index {index!r}> but was"
                        " unable to perform successful extraction",
                    )
            if not values:
                raise exc.NotFound(
                    f"Unable to find result {name!r}, searched"
                    f" {len(defaults) + len(atoms)} providers"
                )
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

    def _scope_levels(
        self, atom_name: str | None, scope_walker: Any, atom_providers: list[tuple[Any, Any]]
    ) -> list[list[str]]:
        if scope_walker is None and atom_name:
            scope_walker = self._scope_fetcher(atom_name)
        if scope_walker is None:
            # No scoping known: every registered provider is one (latest-last) level.
            return [[p for p, _ in atom_providers]]
        return [list(level) for level in scope_walker]

    def fetch_mapped_args(
        self,
        args_mapping: Mapping[str, str],
        atom_name: str | None = None,
        scope_walker: Any = None,
        optional_args: Iterable[str] | None = None,
    ) -> dict[str, Any]:
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
                        raise exc.NotFound(
                            f"Name {symbol!r} is not mapped as a produced output by any providers"
                        )
                    defaults, atoms = self._split_providers(symbol)
                    if defaults:
                        provider, index = defaults[0]
                        try:
                            mapped[arg_name] = item_from(self._default_container(provider), index)
                        except EXTRACTION_EXCEPTIONS:
                            exc.raise_with_cause(
                                exc.NotFound, f"Unable to find injected value {symbol!r}"
                            )
                        continue
                    if walker_levels is None:
                        walker_levels = self._scope_levels(atom_name, scope_walker, atoms)
                    found, value = self._from_atom_levels(symbol, atoms, walker_levels)
                    if not found:
                        raise exc.NotFound(
                            f"Mapped argument {arg_name!r} <= {symbol!r} was not"
                            " produced by any accessible provider"
                            f" ({len(atoms)} possible providers were scanned)"
                        )
                    mapped[arg_name] = value
            return mapped

    def _from_atom_levels(
        self, symbol: str, atoms: list[tuple[Any, Any]], levels: list[list[str]]
    ) -> tuple[bool, Any]:
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
                    return True, item_from(container, index)
                except EXTRACTION_EXCEPTIONS:
                    pass
            if level_had_results:
                names = [p for p, _ in candidates]
                raise exc.NotFound(
                    f"Unable to find result {symbol!r}, expected to be able to"
                    f" find it created by one of {names} but was unable to"
                    " perform successful extraction"
                )
        return False, None

    def fetch_unsatisfied_args(
        self,
        atom_name: str,
        args_mapping: Mapping[str, str],
        scope_walker: Any = None,
        optional_args: Iterable[str] | None = None,
    ) -> set[str]:
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
