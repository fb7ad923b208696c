"""OrderedSet: a set that remembers insertion order (atoms' requires/provides)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Set
from typing import Any


class OrderedSet(Set):
    """An immutable-by-convention set that iterates in insertion order."""

    __slots__ = ("_data",)

    def __init__(self, iterable: Iterable[Hashable] | None = None) -> None:
        self._data: dict[Hashable, None] = dict.fromkeys(iterable) if iterable else {}

    @classmethod
    def _from_iterable(cls, it: Iterable[Hashable]) -> OrderedSet:
        return cls(it)

    def __contains__(self, value: object) -> bool:
        return value in self._data

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._data)!r})"

    __hash__ = Set._hash

    def __and__(self, other: Any) -> OrderedSet:
        # collections.abc.Set iterates the *other* operand; keep our order.
        if not isinstance(other, Iterable):
            return NotImplemented
        return self.intersection(other)

    def copy(self) -> OrderedSet:
        """Return a shallow copy."""
        return type(self)(self._data)

    def union(self, *others: Iterable[Hashable]) -> OrderedSet:
        """Return the items of self then of each other (first occurrence wins)."""
        data = dict(self._data)
        for other in others:
            data.update(dict.fromkeys(other))
        return type(self)(data)

    def intersection(self, *others: Iterable[Hashable]) -> OrderedSet:
        """Return the items of self present in every other."""
        keep = [set(o) for o in others]
        return type(self)(v for v in self._data if all(v in k for k in keep))

    def difference(self, *others: Iterable[Hashable]) -> OrderedSet:
        """Return the items of self present in no other."""
        drop: set[Hashable] = set().union(*others) if others else set()
        return type(self)(v for v in self._data if v not in drop)

    def issubset(self, other: Iterable[Hashable]) -> bool:
        """Return whether every item of self is in other."""
        other_set = other if isinstance(other, Set) else set(other)
        return all(v in other_set for v in self._data)

    def issuperset(self, other: Iterable[Hashable]) -> bool:
        """Return whether every item of other is in self."""
        return all(v in self._data for v in other)
