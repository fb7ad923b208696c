"""Interruptible timeouts, as TaskFlow exposes them (conductors and jobboards wait on them)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Timeout", "convert_to_timeout"]


class Timeout:
    """A wait of ``value`` seconds that another thread can cut short with interrupt()."""

    def __init__(
        self, value: float, event_factory: Callable[[], threading.Event] = threading.Event
    ) -> None:
        if value < 0:
            raise ValueError(f"Timeout value must be greater or equal to zero, not {value}")
        self._value = value
        self._event = event_factory()

    @property
    def value(self) -> float:
        """The timeout, in seconds."""
        return self._value

    def interrupt(self) -> None:
        """End the current (and any later) wait() now, until reset()."""
        self._event.set()

    def is_stopped(self) -> bool:
        """Whether interrupt() was called since the last reset()."""
        return self._event.is_set()

    def wait(self) -> bool:
        """Wait ``value`` seconds or until interrupted; True when interrupted."""
        return self._event.wait(self._value)

    def reset(self) -> None:
        """Make wait() wait again."""
        self._event.clear()


def convert_to_timeout(
    value: Any = None,
    default_value: Any = None,
    event_factory: Callable[[], threading.Event] = threading.Event,
) -> Timeout:
    """A Timeout from ``value`` (a Timeout, or seconds as a number or a string).

    ``value`` None uses ``default_value``. Raises ValueError for anything
    that is not a non-negative number of seconds.
    """
    if value is None:
        value = default_value
    if isinstance(value, Timeout):
        return value
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Timeout value {value!r} is not a number of seconds") from None
    return Timeout(seconds, event_factory=event_factory)
