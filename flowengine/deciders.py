"""Decider depths: how far the effect of a link decider that says 'no' reaches."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Depth(enum.StrEnum):
    """How much of the graph a negative decider marks as IGNORE."""

    #: Everything reachable from the decided link (the default).
    ALL = "ALL"
    #: Only atoms inside the same flow as the link's target.
    FLOW = "FLOW"
    #: Only the target atom and its direct successors.
    NEIGHBORS = "NEIGHBORS"
    #: Only the target atom itself.
    ATOM = "ATOM"

    # TaskFlow's name for this lookup shadows str.translate, which makes no
    # sense on a depth name anyway: the override is deliberate.
    @classmethod
    def translate(cls, desired_depth: Depth | str) -> Depth:  # type: ignore[override]
        """Return the Depth for a Depth or a (case-insensitive) name.

        Raises TypeError for non-strings, ValueError for unknown names.
        """
        if isinstance(desired_depth, cls):
            return desired_depth
        if not isinstance(desired_depth, str):
            raise TypeError(
                f"Unexpected desired depth type, string type expected, not {type(desired_depth)}"
            )
        try:
            return cls(desired_depth.upper())
        except ValueError:
            names = sorted(d.name for d in cls)
            raise ValueError(
                f"Unexpected decider depth value, one of {names}"
                f" (case-insensitive) is expected and not"
                f" '{desired_depth}'"
            ) from None


# Widest influence first.
_WIDEST_FIRST = (Depth.ALL, Depth.FLOW, Depth.NEIGHBORS, Depth.ATOM)
_RANK = {depth: rank for rank, depth in enumerate(_WIDEST_FIRST)}


def pick_widest(depths: Iterable[Depth | str]) -> Depth:
    """Return the depth with the widest influence among depths (ValueError if empty)."""
    return _WIDEST_FIRST[min(_RANK[Depth.translate(d)] for d in depths)]
