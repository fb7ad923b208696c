"""Where the worker-based engine reads the time: one clock per process.

Every wall-clock reading of ``worker_based`` (``expires``, the send time
in a message's headers, event timestamps) goes through :func:`wall`, and
every elapsed-time reading that must agree with one goes through
:func:`monotonic`, so the whole package sees one clock that can be swapped
as a whole: a test runs a worker whose clock is two minutes off with
:func:`install` (``OffsetClock``) and every decision the worker takes sees
that clock, as it would see a host's badly set system clock.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = [
    "Clock",
    "OffsetClock",
    "SystemClock",
    "current",
    "host_wall",
    "install",
    "monotonic",
    "wall",
]


class Clock(Protocol):
    """A source of time: wall-clock epoch seconds and monotonic seconds."""

    def wall(self) -> float:
        """Seconds since the epoch, as this host believes them."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start; never goes back (elapsed time only)."""


class SystemClock:
    """The host's clocks (``time.time`` and ``time.monotonic``)."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class OffsetClock:
    """``base`` with its wall clock ``offset_s`` seconds ahead (negative: behind)."""

    def __init__(self, offset_s: float, base: Clock | None = None) -> None:
        self.offset_s = float(offset_s)
        self._base = base or SystemClock()

    def wall(self) -> float:
        return self._base.wall() + self.offset_s

    def monotonic(self) -> float:
        return self._base.monotonic()


_CURRENT: Clock = SystemClock()


def current() -> Clock:
    """The clock this process uses."""
    return _CURRENT


def install(clock: Clock) -> Clock:
    """Use ``clock`` from now on, in the whole process; returns the one it replaces."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, clock
    return previous


def wall() -> float:
    """Epoch seconds by the current clock."""
    return _CURRENT.wall()


def monotonic() -> float:
    """Monotonic seconds by the current clock."""
    return _CURRENT.monotonic()


def host_wall() -> float:
    """Epoch seconds by the host's own clock, whatever :func:`install` put in place.

    For comparing with times a library wrote with ``time.time()`` (kombu's
    Redis transport scores the messages it parks so): those follow the
    host, not this process's swappable clock.
    """
    return time.time()
