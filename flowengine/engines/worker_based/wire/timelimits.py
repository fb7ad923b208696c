"""Per-task time limits: where they come from and how they travel.

A task declares limits with two class (or instance) attributes, read next to
TaskFlow's ``version`` and ``default_provides``::

    class Resize(task.Task):
        soft_time_limit = 50   # seconds: SoftTimeLimitExceeded is raised inside execute()
        time_limit = 60        # seconds: the body is stopped, the request fails

The executor sends the limits of the task *instance* in the ``timelimit``
header (``[soft, hard]``, either may be null), so a per-instance value
overrides the class. A worker takes, field by field, the header, else the
class attributes of its own task class, else its own defaults
(``--soft-time-limit`` / ``--time-limit``); how it enforces them is in
:mod:`..worker_side.timelimits`.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire.names import HEADER_TIMELIMIT

LOG = logging.getLogger(__name__)

#: Task attribute holding the soft limit (seconds): an exception inside the body.
SOFT_ATTR = "soft_time_limit"
#: Task attribute holding the hard limit (seconds): the body is stopped.
HARD_ATTR = "time_limit"


class TimeLimits(NamedTuple):
    """Soft and hard limits in seconds for one task body (None: no limit)."""

    soft: float | None = None
    hard: float | None = None

    @property
    def any(self) -> bool:
        """Whether at least one limit is set."""
        return self.soft is not None or self.hard is not None

    def __str__(self) -> str:
        def fmt(v: float | None) -> str:
            return "none" if v is None else f"{v:g} s"

        return f"soft {fmt(self.soft)}, hard {fmt(self.hard)}"


NO_LIMITS = TimeLimits()


def _checked(value: Any, what: str) -> float | None:
    """A limit value: None or a positive number of seconds; InvalidFormat otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise exc.InvalidFormat(
            f"{what} must be a positive number of seconds or null, not {value!r}"
        )
    return float(value)


def make(soft: Any = None, hard: Any = None) -> TimeLimits:
    """TimeLimits from two values (checked: positive seconds or None)."""
    return TimeLimits(_checked(soft, "soft time limit"), _checked(hard, "hard time limit"))


def from_task(task: Any) -> TimeLimits:
    """The limits a task (instance or class) declares through its attributes."""
    return make(getattr(task, SOFT_ATTR, None), getattr(task, HARD_ATTR, None))


def to_header(limits: TimeLimits) -> list[float | None] | None:
    """The ``timelimit`` header value for ``limits`` (None when there are none)."""
    return [limits.soft, limits.hard] if limits.any else None


def parse_header(value: Any) -> TimeLimits:
    """Read a ``timelimit`` header (``[soft, hard]`` or null); InvalidFormat if unreadable."""
    if value is None:
        return NO_LIMITS
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise exc.InvalidFormat(f"Header '{HEADER_TIMELIMIT}' must be [soft, hard], not {value!r}")
    return make(value[0], value[1])


def resolve(header: Any, task_cls: Any, default: TimeLimits = NO_LIMITS) -> TimeLimits:
    """The limits a worker applies: header, else task class attributes, else ``default``.

    Raises InvalidFormat when the header cannot be read (the request is refused).
    """
    sent = parse_header(header)
    try:
        declared = from_task(task_cls)
    except exc.InvalidFormat:
        LOG.warning("Task class %s declares invalid time limits; ignoring them", task_cls)
        declared = NO_LIMITS
    soft = next((v for v in (sent.soft, declared.soft, default.soft) if v is not None), None)
    hard = next((v for v in (sent.hard, declared.hard, default.hard) if v is not None), None)
    return TimeLimits(soft, hard)


def header_for(task: Any) -> list[float | None] | None:
    """Executor side: the ``timelimit`` header for ``task`` (None when it sets no limits)."""
    try:
        return to_header(from_task(task))
    except exc.InvalidFormat as e:
        LOG.warning("Task %r has invalid time limits (%s); sending none", task, e)
        return None


# --- running a body with limits (threads) ---------------------------------------
