"""Linear flow: children run one after another, in the order they were added."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flowengine import flow


class Flow(flow.ItemListFlow):
    """Runs its children in insertion order and reverts them in reverse order."""

    def iter_links(self) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
        previous = None
        for index, item in enumerate(self._items):
            if index:
                yield previous, item, {flow.LINK_INVARIANT: True}
            previous = item

    @property
    def requires(self) -> frozenset[str]:
        """Symbols a child needs that no earlier child (or the retry) provides."""
        required: set[str] = set()
        provided: set[str] = set()
        if self._retry is not None:
            required.update(self._retry.requires)
            provided.update(self._retry.provides)
        for item in self._items:
            required.update(s for s in item.requires if s not in provided)
            provided.update(item.provides)
        return frozenset(required)
