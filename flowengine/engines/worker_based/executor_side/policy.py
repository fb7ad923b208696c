"""How long an engine waits for its remote requests, and how often it re-dispatches them.

One frozen value checked once where the engine options are read; the
request path, the reply handler and the housekeeper all read the same one.
See doc/source/reliability.rst for what each setting means to a user.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import names

__all__ = ["LIVENESS_OPTIONS", "RequestPolicy"]

#: Engine options (and WorkerTaskExecutor arguments) of the same names.
LIVENESS_OPTIONS = (
    "heartbeat_interval",
    "heartbeat_misses",
    "lost_after",
    "max_attempts",
    "run_timeout",
    "late_pending",
)


@dataclasses.dataclass(frozen=True)
class RequestPolicy:
    """Deadlines and re-dispatch of remote requests (immutable; checked on construction).

    ``transition_timeout``: seconds (None: no limit) a request may stay
    WAITING or PENDING before it fails with RequestTimeout.
    ``heartbeat_interval``: assumed for workers that advertise none;
    a held request is lost after its worker's interval x ``heartbeat_misses``
    of silence, or after ``lost_after`` when given. ``max_attempts``: how
    many dispatches one request gets in all. ``run_timeout``: seconds a
    request may run once RUNNING (None: no limit). ``late_pending``: a
    worker that answers a request within 50 ms of taking it sends no
    PENDING (one message less per task); the engine then learns who holds a
    request only 50 ms after it was taken, so a worker killed within those
    50 ms leaves it to ``transition_timeout`` (RequestTimeout) instead of a
    re-dispatch after the loss bound (see doc/source/protocol.rst). None
    (the default): only for requests whose workers all announced that they
    close that gap (RabbitMQ workers do: names.HEADER_SETTLES_AFTER_RUN).

    Raises ValueError naming the setting that is out of range.
    """

    transition_timeout: float | None = names.REQUEST_TIMEOUT_S
    heartbeat_interval: float = lv.HEARTBEAT_INTERVAL_S
    heartbeat_misses: int = lv.HEARTBEAT_MISSES
    lost_after: float | None = None
    max_attempts: int = lv.MAX_ATTEMPTS
    run_timeout: float | None = None
    late_pending: bool | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "heartbeat_interval", lv.check_interval(self.heartbeat_interval))
        if int(self.heartbeat_misses) < 1:
            raise ValueError(f"heartbeat_misses must be >= 1 (got {self.heartbeat_misses!r})")
        set_(self, "heartbeat_misses", int(self.heartbeat_misses))
        if self.lost_after is not None:
            set_(self, "lost_after", lv.check_interval(self.lost_after, "lost_after"))
        if int(self.max_attempts) < 1:
            raise ValueError(f"max_attempts must be >= 1 (got {self.max_attempts!r})")
        set_(self, "max_attempts", int(self.max_attempts))
        if self.run_timeout is not None and not self.run_timeout > 0:
            raise ValueError(f"run_timeout must be > 0 seconds or None (got {self.run_timeout!r})")
        if self.late_pending is not None and not isinstance(self.late_pending, bool):
            raise ValueError(
                f"late_pending must be True, False or None (got {self.late_pending!r})"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RequestPolicy:
        """The policy the engine options ask for (defaults for what they leave out)."""
        given = {name: options[name] for name in LIVENESS_OPTIONS if name in options}
        if "transition_timeout" in options:
            given["transition_timeout"] = options["transition_timeout"]
        return cls(**given)

    def lost_after_for(self, advertised_interval: float | None) -> float:
        """Seconds of silence after which a request held by a worker is lost.

        ``advertised_interval``: the heartbeat interval that worker announced
        (None: it announced none).
        """
        if self.lost_after is not None:
            return self.lost_after
        return lv.lost_after(advertised_interval or self.heartbeat_interval, self.heartbeat_misses)

    def is_last_attempt(self, attempt: int) -> bool:
        """True when dispatch number ``attempt`` (0-based) may not be followed by another."""
        return attempt + 1 >= self.max_attempts
