"""The order in which a conductor tries to claim the jobs of one listing.

Every conductor on a board reads the same listing (most urgent, then
oldest, first). Walked in that order by all of them, each job is attempted
by every conductor and all but one lose the race: with N conductors, N - 1
wasted claims per job. So a conductor that sees others on the board walks
each priority band from a random point of its own, and jumps to another
random point after a lost race (two conductors walking the same stretch
would otherwise keep colliding). Priority still rules: a band is finished
before the next, less urgent one starts. A conductor alone on the board
keeps the strict order, as TaskFlow's does.
"""

from __future__ import annotations

import collections
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["ClaimWalk"]


class ClaimWalk:
    """Iterates over claimable jobs (sorted by the board) in the order to try them.

    ``spread``: start each priority band at a random job (other claimers
    are about); :meth:`scatter` moves the rest of the current band to a new
    random starting point (call it after a lost race).
    """

    def __init__(self, jobs: Sequence[Any], spread: bool, rng: random.Random) -> None:
        self._rng = rng
        self._spread = spread
        self._bands: collections.deque[collections.deque[Any]] = collections.deque(
            collections.deque(band) for _p, band in itertools.groupby(jobs, _priority)
        )
        for band in self._bands:
            self._rotate(band)

    def _rotate(self, band: collections.deque[Any]) -> None:
        if self._spread and len(band) > 1:
            band.rotate(-self._rng.randrange(len(band)))

    def scatter(self) -> None:
        """Continue the current band from another random job (others walk near here)."""
        self._spread = True
        if self._bands:
            self._rotate(self._bands[0])

    def peek(self) -> Any:
        """The job the walk yields next (None at its end), without taking it."""
        for band in self._bands:
            if band:
                return band[0]
        return None

    def __iter__(self) -> Iterator[Any]:
        while self._bands:
            band = self._bands[0]
            if not band:
                self._bands.popleft()
                continue
            yield band.popleft()


def _priority(job: Any) -> Any:
    return getattr(job, "priority", None)
