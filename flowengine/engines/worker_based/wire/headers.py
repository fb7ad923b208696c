"""flowengine's message headers, read once into a checked, immutable value.

Headers come from peers, so every field is checked where it is read, here:
an absent or unusable value is None (a TaskFlow peer sends none of them),
and a malformed ``expires`` -- the one header whose misreading could run
work nobody waits for -- is named in :attr:`Headers.problems` so the worker
can refuse the request with the reason. Nothing here raises.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import names

__all__ = ["Headers"]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _bounded_text(value: Any, max_chars: int) -> str | None:
    text = _text(value)
    return text if text is not None and len(text) <= max_chars else None


#: Longest trace headers read: W3C's traceparent is 55 characters today
#: (room left for later versions), a tracestate at most 32 members of ~16.
MAX_TRACEPARENT_CHARS = 256
MAX_TRACESTATE_CHARS = 1024


def _epoch(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _seconds(value: Any) -> float | None:
    seconds = _epoch(value)
    return seconds if seconds is not None and seconds >= 0 else None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _misses(value: Any) -> int | None:
    count = _count(value)
    return count if count else None


@dataclasses.dataclass(frozen=True)
class Headers:
    """What a message's headers say (None: absent or unusable)."""

    #: How many times the request was dispatched before (requests; replies echo it).
    attempt: int | None = None
    #: The worker that sent a reply or announcement.
    worker_id: str | None = None
    #: ``hostname:pid`` of the sender.
    origin: str | None = None
    #: The engine submission a request belongs to (the same on every attempt).
    request_id: str | None = None
    #: The sender's heartbeat interval (s).
    heartbeat_s: float | None = None
    #: When nobody waits for the request any more (epoch s).
    expires: float | None = None
    #: The ``[soft, hard]`` time limits as sent (the worker resolves them).
    timelimit: Any = None
    #: Trace ids: the flow and the flow detail the request belongs to.
    root_id: str | None = None
    parent_id: str | None = None
    #: The engine's loss bound: heartbeats a held request may miss, or seconds.
    heartbeat_misses: int | None = None
    lost_after: float | None = None
    #: A worker's goodbye announcement.
    leaving: bool = False
    #: A worker's PENDING for a redelivered request it did not run (see
    #: :mod:`..worker_side.intake`).
    declined: bool = False
    #: A request whose engine takes a late PENDING (see names.HEADER_LATE_PENDING).
    late_pending: bool = False
    #: When the engine created the request, and published this dispatch of
    #: it (epoch s; the worker's events report them).
    created: float | None = None
    enqueued: float | None = None
    #: How long an outcome's body ran on its worker (s).
    run_s: float | None = None
    #: The engine's span for the request's atom (W3C Trace Context, as sent;
    #: flowengine.tracing checks the format).
    traceparent: str | None = None
    tracestate: str | None = None
    #: Why a header that matters could not be read (empty: all fine).
    problems: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> Headers:
        """Read ``raw`` (a message's headers, possibly None)."""
        raw = raw or {}
        problems: list[str] = []
        try:
            expires = names.parse_expires(raw.get(names.HEADER_EXPIRES))
        except exc.InvalidFormat as e:
            expires = None
            problems.append(str(e))
        headers = object.__new__(cls)
        # Every message's headers are read: filling the instance's dict at
        # once costs a third of the frozen __init__, which sets each of the
        # fields through object.__setattr__. Fields not set here fall back
        # to their class-level defaults.
        headers.__dict__.update(
            attempt=_count(raw.get(names.HEADER_ATTEMPT)),
            worker_id=(
                None
                if raw.get(names.HEADER_WORKER_ID) is None
                else str(raw[names.HEADER_WORKER_ID])
            ),
            origin=_text(raw.get(names.HEADER_ORIGIN)),
            request_id=_text(raw.get(lv.HEADER_REQUEST_ID)),
            heartbeat_s=lv.parse_heartbeat(raw.get(lv.HEADER_HEARTBEAT)),
            expires=expires,
            timelimit=raw.get(names.HEADER_TIMELIMIT),
            root_id=_text(raw.get(names.HEADER_ROOT_ID)),
            parent_id=_text(raw.get(names.HEADER_PARENT_ID)),
            heartbeat_misses=_misses(raw.get(lv.HEADER_HEARTBEAT_MISSES)),
            lost_after=lv.parse_heartbeat(raw.get(lv.HEADER_LOST_AFTER)),
            leaving=bool(raw.get(names.HEADER_LEAVING)),
            declined=raw.get(names.HEADER_DECLINED) is True,
            late_pending=raw.get(names.HEADER_LATE_PENDING) is True,
            created=_epoch(raw.get(names.HEADER_CREATED)),
            enqueued=_epoch(raw.get(names.HEADER_ENQUEUED)),
            run_s=_seconds(raw.get(names.HEADER_RUN_S)),
            traceparent=_bounded_text(raw.get(names.HEADER_TRACEPARENT), MAX_TRACEPARENT_CHARS),
            tracestate=_bounded_text(raw.get(names.HEADER_TRACESTATE), MAX_TRACESTATE_CHARS),
            problems=tuple(problems),
        )
        return headers

    @property
    def from_flowengine_engine(self) -> bool:
        """True when a request carries what every flowengine engine sends."""
        return self.origin is not None or self.attempt is not None

    @property
    def from_flowengine_worker(self) -> bool:
        """True when a reply or announcement carries what every flowengine worker sends."""
        return self.worker_id is not None
