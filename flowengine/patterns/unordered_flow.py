"""Unordered flow: children have no order between them and may run in parallel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flowengine import flow


class Flow(flow.ItemListFlow):
    """Runs its children in any order (concurrently when the engine can).

    Children can not feed each other: a symbol one child requires and another
    provides is still a requirement of the whole flow.
    """

    def iter_links(self) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
        return iter(())

    @property
    def requires(self) -> frozenset[str]:
        """Everything the children (and the retry) need, minus what the retry provides."""
        required: set[str] = set()
        retry_provides: frozenset[str] = frozenset()
        if self._retry is not None:
            required.update(self._retry.requires)
            retry_provides = frozenset(self._retry.provides)
        for item in self._items:
            required.update(s for s in item.requires if s not in retry_provides)
        return frozenset(required)
