"""What an event is: its types, standard fields, Lamport clock and timings.

Every event is one JSON object with the standard fields (:data:`STANDARD_FIELDS`)
plus the fields of its type. Nothing here touches the broker, so readers of
events (viewers, tests) can use it without a connection.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from flowengine.engines.worker_based.wire import clock
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.wire.names import HEADER_CREATED, HEADER_ENQUEUED

#: Seconds between worker-heartbeat events: often enough for a live view to
#: tell a silent worker from a dead one within a few seconds.
HEARTBEAT_PERIOD_S = 2.0

#: Event types, by sender.
WORKER_EVENTS = ("worker-online", "worker-heartbeat", "worker-offline")
TASK_EVENTS = (
    "task-received",
    "task-started",
    "task-progress",
    "task-succeeded",
    "task-failed",
    "task-retried",
    "task-expired",
)
FLOW_EVENTS = ("flow-started", "flow-finished")
EVENT_TYPES = WORKER_EVENTS + TASK_EVENTS + FLOW_EVENTS

#: Task event types after which a request sends nothing more.
TERMINAL_TASK_EVENTS = ("task-succeeded", "task-failed", "task-expired")

#: Standard fields every event has.
STANDARD_FIELDS = ("type", "hostname", "pid", "clock", "timestamp", "utcoffset")


def utcoffset_hours() -> int:
    """This host's offset from UTC in whole hours (east positive)."""
    offset = time.localtime().tm_gmtoff
    return int(round(offset / 3600))


def default_hostname() -> str:
    """``name@host`` for this process: pid-qualified so two workers on a host differ."""
    return f"{os.getpid()}@{socket.gethostname()}"


def make_event(
    event_type: str, hostname: str, pid: int, fields: Mapping[str, Any]
) -> dict[str, Any]:
    """A new event: the standard fields (clock still 0, for the sender to set), then ``fields``."""
    event = {
        "type": event_type,
        "hostname": hostname,
        "pid": pid,
        "clock": 0,
        "timestamp": clock.wall(),
        "utcoffset": utcoffset_hours(),
    }
    event.update(fields)
    return event


class LamportClock:
    """A Lamport clock: strictly increasing per sender, moved past every value seen."""

    def __init__(self, initial: int = 0) -> None:
        self._value = initial
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        """The last value handed out (or seen)."""
        return self._value

    def forward(self) -> int:
        """Advance for a local event and return the new value."""
        with self._lock:
            self._value += 1
            return self._value

    def adjust(self, other: int) -> int:
        """Move past a received value ``other``; return the new value."""
        with self._lock:
            self._value = max(self._value, int(other)) + 1
            return self._value


def request_timings(headers: Headers) -> dict[str, float]:
    """RQ-style timings of a request from its headers (epoch seconds; absent ones omitted)."""
    timings = {"created": headers.created, "enqueued": headers.enqueued}
    return {k: v for k, v in timings.items() if v is not None}


def timing_headers(created_at: float) -> dict[str, float]:
    """Headers an executor adds to each dispatch: creation and enqueue times."""
    return {HEADER_CREATED: created_at, HEADER_ENQUEUED: clock.wall()}
