"""ServerOptions: how one consume loop of a worker serves its topic, in one value.

A :class:`~.server.Server` takes TaskFlow's first arguments (topic,
exchange, executor, endpoints), a BrokerSettings and one ServerOptions. A
:class:`~.worker.Worker` fills it from its
:class:`~.settings.WorkerSettings` and the parts its topics share (the
priority room, the middleware list, the task runner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.worker_side import runner as running_mod
from flowengine.engines.worker_based.worker_side.middleware import Middleware
from flowengine.engines.worker_based.worker_side.priority import PriorityRoom

__all__ = ["ServerOptions"]


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """How a server serves (immutable; checked when made).

    Raises ValueError for a heartbeat interval that is too short, a negative
    ``rank`` or a ``capacity`` below 1.
    """

    #: Unique id of the worker (header ``worker_id`` of its messages); None: a new one.
    worker_id: str | None = None
    #: Publish events (see :mod:`..events`); None: the default (off).
    events: bool | None = None
    #: How task bodies run (threads or forked children, default time limits);
    #: None: in threads, no default limits.
    task_runner: running_mod.TaskRunner | None = None
    #: Seconds between two heartbeats of each held request, advertised in the
    #: ``heartbeat`` header of its replies.
    heartbeat_interval: float = lv.HEARTBEAT_INTERVAL_S
    #: How many requests may be held at once; None: HELD_PER_THREAD per
    #: thread of the executor (unbounded when its size is unknown). Ignored
    #: with a ``room``, whose capacity wins.
    capacity: int | None = None
    #: The worker's ordered middleware list, shared by its topics (see
    #: :mod:`.middleware`); None: :func:`~.server.default_middleware`, with
    #: events as ``events`` says.
    middleware: Sequence[Middleware] | None = None
    #: Shared by the servers of a worker of several topics: bounds what they
    #: hold together and lets ``rank`` 0 go first (see :mod:`.priority`).
    room: PriorityRoom | None = None
    #: This topic's place in the worker's priority order (0: first).
    rank: int = 0
    #: Name of this consume loop's Redis lease (default: the worker id;
    #: unique per consume loop).
    lease_id: str | None = None
    #: Run a short request taken while nothing else is held on the consume
    #: loop's thread rather than the executor (see :mod:`.short_bodies`): for
    #: a pool the worker owns, never for an executor of the caller's.
    short_bodies_here: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "heartbeat_interval", lv.check_interval(self.heartbeat_interval))
        if self.rank < 0:
            raise ValueError(f"rank must be >= 0, not {self.rank!r}")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"capacity must be >= 1 or None, not {self.capacity!r}")
