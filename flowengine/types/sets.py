"""OrderedSet: a set that remembers insertion order (atoms' requires/provides)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from typing import Any, TypeVar

#: An element (hashable at run time; typeshed's Set does not bound it either).
_T = TypeVar("_T")
_S = TypeVar("_S")


class OrderedSet(Set[_T]):
    """An immutable-by-convention set that iterates in insertion order."""

    __slots__ = ("_data",)

    #: The empty set (shared: an OrderedSet is never changed).
    EMPTY: OrderedSet[Any]

    def __init__(self, iterable: Iterable[_T] | None = None) -> None:
        self._data: dict[_T, Any] = dict.fromkeys(iterable) if iterable else {}

    @classmethod
    def over_keys(cls, mapping: dict[_T, Any]) -> OrderedSet[_T]:
        """The set of ``mapping``'s keys, sharing its dict (neither may change afterwards)."""
        ordered: OrderedSet[_T] = cls.__new__(cls)
        ordered._data = mapping
        return ordered

    @classmethod
    def _from_iterable(cls, it: Iterable[_S]) -> OrderedSet[_S]:
        # Set's operators build their results through this, with elements of
        # any type; mypy cannot re-parameterise ``cls`` (bound to _T) for _S.
        return cls(it)  # type: ignore[arg-type, return-value]

    def __contains__(self, value: object) -> bool:
        return value in self._data

    def __iter__(self) -> Iterator[_T]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._data)!r})"

    __hash__ = Set._hash

    def __and__(self, other: Any) -> OrderedSet[_T]:
        # collections.abc.Set iterates the *other* operand; keep our order.
        if not isinstance(other, Iterable):
            return NotImplemented
        return self.intersection(other)

    def copy(self) -> OrderedSet[_T]:
        """Return a shallow copy."""
        return type(self)(self._data)

    def union(self, *others: Iterable[_T]) -> OrderedSet[_T]:
        """Return the items of self then of each other (first occurrence wins)."""
        data = dict(self._data)
        for other in others:
            data.update(dict.fromkeys(other))
        return type(self)(data)

    def intersection(self, *others: Iterable[_T]) -> OrderedSet[_T]:
        """Return the items of self present in every other."""
        keep = [set(o) for o in others]
        return type(self)(v for v in self._data if all(v in k for k in keep))

    def difference(self, *others: Iterable[_T]) -> OrderedSet[_T]:
        """Return the items of self present in no other."""
        drop: set[_T] = set().union(*others) if others else set()
        return type(self)(v for v in self._data if v not in drop)

    def issubset(self, other: Iterable[_T]) -> bool:
        """Return whether every item of self is in other."""
        other_set = other if isinstance(other, Set) else set(other)
        return all(v in other_set for v in self._data)

    def issuperset(self, other: Iterable[_T]) -> bool:
        """Return whether every item of other is in self."""
        return all(v in self._data for v in other)


OrderedSet.EMPTY = OrderedSet()
