"""Liveness and expiry: heartbeat defaults, the headers that carry them, deadlines.

A worker repeats a reply for every request it holds (PENDING while queued
on it, RUNNING while it runs) every ``heartbeat_interval`` seconds, from a
thread of its own; it advertises that interval in the ``heartbeat`` header
of its announcements and replies. An executor declares a held request lost
after ``heartbeat_interval × heartbeat_misses`` seconds without a reply,
computed from the interval of the worker that holds it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from flowengine.engines.worker_based.wire import clock

#: Header: the sender's heartbeat interval in seconds (worker announcements,
#: NOTIFY answers, PENDING/RUNNING replies).
HEADER_HEARTBEAT = "heartbeat"

#: Header: id of one engine submission (one execute or revert call), the
#: same on every attempt. Workers remember finished requests under it, so a
#: task a Retry runs again (same task uuid, new submission) is run again.
HEADER_REQUEST_ID = "request_id"

#: Headers of a request: the engine's loss bound for it, so the worker that
#: holds it can stop it before the engine dispatches it again (see
#: worker_side/fence.py): ``heartbeat_misses`` (its policy's), and
#: ``lost_after`` (seconds) when the engine sets one for every worker.
HEADER_HEARTBEAT_MISSES = "heartbeat_misses"
HEADER_LOST_AFTER = "lost_after"

#: Seconds between two heartbeats of a held request. Two seconds keeps a
#: thousand held requests at 500 small messages/s while still telling a
#: dead worker from a slow one in seconds (TaskFlow never tells them apart).
HEARTBEAT_INTERVAL_S = 2.0

#: Heartbeats in a row a request may miss before it is declared lost: one
#: late broker hop or a stop-the-world pause must not cost a re-run.
HEARTBEAT_MISSES = 3

#: Shortest heartbeat interval accepted (s): below this the heartbeats of a
#: busy worker would crowd out its real replies.
MIN_HEARTBEAT_INTERVAL_S = 0.05

#: How many times one request may be dispatched in total when its workers
#: are lost: a task that kills every worker it lands on must not take the
#: whole pool down.
MAX_ATTEMPTS = 3

#: The ``expires`` a request carries is this much earlier than the moment the
#: engine gives up on it (capped at EXPIRES_MARGIN_FRACTION of the timeout):
#: a worker starting it just before ``expires`` still has time to say so
#: before nobody listens, and small clock differences between hosts are covered.
EXPIRES_MARGIN_S = 1.0
EXPIRES_MARGIN_FRACTION = 0.1


def broadcast_routing_key(topic: str) -> str:
    """Routing key reaching every flowengine worker of ``topic`` (discovery)."""
    return f"{topic}.broadcast"


def lost_after(interval_s: float, misses: int) -> float:
    """Seconds of silence after which a held request is lost."""
    return interval_s * misses


def check_interval(interval_s: Any, what: str = "heartbeat_interval") -> float:
    """``interval_s`` as a float; ValueError unless finite and >= MIN_HEARTBEAT_INTERVAL_S."""
    try:
        value = float(interval_s)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, not {interval_s!r}") from None
    if not math.isfinite(value) or value < MIN_HEARTBEAT_INTERVAL_S:
        raise ValueError(
            f"{what} must be at least {MIN_HEARTBEAT_INTERVAL_S} s (got {interval_s!r})"
        )
    return value


def parse_heartbeat(value: Any) -> float | None:
    """The heartbeat interval a peer advertised (None when absent or unusable)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return check_interval(value)
    except ValueError:
        return None


def expires_at(deadline: float, timeout: float) -> float:
    """Epoch seconds to send as ``expires`` for a monotonic ``deadline``."""
    margin = min(EXPIRES_MARGIN_S, max(0.0, timeout) * EXPIRES_MARGIN_FRACTION)
    return clock.wall() + (deadline - time.monotonic()) - margin
