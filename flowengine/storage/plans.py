"""Argument plans: the engine's per-call way to fetch an atom's arguments.

An argument plan, a tuple of :class:`ArgSpec`, is built once per atom (and
method) at compile time from the compiler's providers
(:func:`make_arg_plan`); :meth:`ArgPlanMixin.fetch_args` then costs
O(number of arguments) per call. Keep that method free of extra calls and
attribute look-ups: it runs before every task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine.storage.base import META_INJECTED
from flowengine.storage.lookup import EXTRACTION_EXCEPTIONS, ResultLookup, item_from


class ArgSpec(NamedTuple):
    """How to obtain one argument: ``arg_name <= symbol`` from ``providers``.

    ``providers`` are atom names, closest first, as the compiler resolved
    them; ``optional`` arguments are left out when nothing provides them.
    """

    arg_name: str
    symbol: str
    providers: tuple[str, ...]
    optional: bool


#: A plan row as the fetching methods read it: ``(arg_name, symbol, providers,
#: optional)``. Both :class:`ArgSpec` and the compiler's ArgSpec are such rows.
ArgRow = tuple[str, str, tuple[str, ...], bool]


def make_arg_plan(
    args_mapping: Mapping[str, str],
    optional_args: Iterable[str] | None,
    providers_of: Callable[[str], Iterable[str]],
) -> tuple[ArgSpec, ...]:
    """Build the plan :meth:`Storage.fetch_args` takes, once per atom and method.

    ``args_mapping`` is ``atom.rebind`` (or ``atom.revert_rebind``),
    ``optional_args`` ``atom.optional`` (or ``revert_optional``) and
    ``providers_of(symbol)`` returns the provider atom names, closest first
    (e.g. ``lambda s: compilation.providers(atom.name, s)``).
    """
    optional = frozenset(optional_args or ())
    return tuple(
        ArgSpec(arg, symbol, tuple(providers_of(symbol)), arg in optional)
        for arg, symbol in args_mapping.items()
    )


class ArgPlanMixin(ResultLookup):
    """Fetching (and checking) an atom's arguments from a precomputed plan."""

    def fetch_args(self, atom_name: str, plan: Sequence[ArgRow]) -> dict[str, Any]:
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
                    out[arg_name] = item_from(container, mappings[provider][symbol])
                except EXTRACTION_EXCEPTIONS:
                    continue
                found = True
                break
            if not found and not optional:
                raise exc.NotFound(
                    f"Mapped argument {arg_name!r} <= {symbol!r} was not produced"
                    " by any accessible provider"
                    f" ({len(providers)} possible providers were scanned)"
                )
        return out

    def unsatisfied_args(self, atom_name: str, plan: Iterable[ArgRow]) -> set[str]:
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
