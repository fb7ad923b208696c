"""Injected values: flow-level ones (persistent or transient) and atom-scoped arguments.

Persistent flow-level values live in a special atom detail (the injector,
:attr:`~flowengine.storage.Storage.injector_name`); transient ones only in
memory, for objects that cannot be saved. Atom-scoped arguments take
precedence over every other source when that atom's arguments are fetched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.storage.base import META_INJECTED, TRANSIENT, StorageBase


class InjectionMixin(StorageBase):
    """Adding injected values, flow-wide or for one atom."""

    def inject_atom_args(
        self, atom_name: str, pairs: Mapping[str, Any] | Iterable[Any], transient: bool = True
    ) -> None:
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
                provider: Any = TRANSIENT
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
