"""A local wake-up: block until something changed since you last looked.

The board's event thread calls :meth:`Waker.notify` for every event it
receives; waiters remember :attr:`Waker.seq` before they look at the board
and then :meth:`Waker.wait` for it to move, so an event that arrives between
looking and waiting is never missed (no lost wake-up, no polling).
"""

from __future__ import annotations

import threading

__all__ = ["Waker"]


class Waker:
    """A change counter with a condition variable."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seq = 0

    @property
    def seq(self) -> int:
        """How many notifications so far (compare with a later value)."""
        with self._cond:
            return self._seq

    def notify(self) -> None:
        """Something changed: wake every waiter."""
        with self._cond:
            self._seq += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float | None) -> bool:
        """Block until ``seq`` differs from ``seen`` (True) or ``timeout`` s pass (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._seq != seen, timeout)
