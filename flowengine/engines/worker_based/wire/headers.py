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
from collections.abc import Callable, Mapping
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
    #: A worker that settles a late request after its run (names.HEADER_SETTLES_AFTER_RUN).
    settles_after_run: bool = False
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
        headers = object.__new__(cls)
        if not raw:
            return headers
        # Every message's headers are read, and most carry a few of the
        # fields (a reply: three or four): only the headers present are
        # converted, straight into the instance's dict (a third of the cost
        # of the frozen __init__, which sets each field through
        # object.__setattr__). Fields absent fall back to their class-level
        # defaults, which is what each converter makes of None too.
        values: dict[str, Any] = {}
        problems: list[str] = []
        for key, value in raw.items():
            known = _FIELDS.get(key)
            if known is None:
                continue
            field, convert = known
            try:
                values[field] = convert(value)
            except exc.InvalidFormat as e:  # only expires raises: see _FIELDS
                values[field] = None
                problems.append(str(e))
        if problems:
            values["problems"] = tuple(problems)
        headers.__dict__.update(values)
        return headers

    @property
    def from_flowengine_engine(self) -> bool:
        """True when a request carries what every flowengine engine sends."""
        return self.origin is not None or self.attempt is not None

    @property
    def from_flowengine_worker(self) -> bool:
        """True when a reply or announcement carries what every flowengine worker sends."""
        return self.worker_id is not None


def _worker_id(value: Any) -> str | None:
    return None if value is None else str(value)


def _same(value: Any) -> Any:
    return value


def _is_true(value: Any) -> bool:
    return value is True


def _traceparent(value: Any) -> str | None:
    return _bounded_text(value, MAX_TRACEPARENT_CHARS)


def _tracestate(value: Any) -> str | None:
    return _bounded_text(value, MAX_TRACESTATE_CHARS)


# Header name -> the Headers field it fills and how it is read (None, or any
# value that cannot be used, gives the field's default). Only expires may
# raise (InvalidFormat): the one header whose misreading could run work
# nobody waits for is refused with its reason, not ignored.
_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    names.HEADER_ATTEMPT: ("attempt", _count),
    names.HEADER_WORKER_ID: ("worker_id", _worker_id),
    names.HEADER_ORIGIN: ("origin", _text),
    lv.HEADER_REQUEST_ID: ("request_id", _text),
    lv.HEADER_HEARTBEAT: ("heartbeat_s", lv.parse_heartbeat),
    names.HEADER_EXPIRES: ("expires", names.parse_expires),
    names.HEADER_TIMELIMIT: ("timelimit", _same),
    names.HEADER_ROOT_ID: ("root_id", _text),
    names.HEADER_PARENT_ID: ("parent_id", _text),
    lv.HEADER_HEARTBEAT_MISSES: ("heartbeat_misses", _misses),
    lv.HEADER_LOST_AFTER: ("lost_after", lv.parse_heartbeat),
    names.HEADER_LEAVING: ("leaving", bool),
    names.HEADER_DECLINED: ("declined", _is_true),
    names.HEADER_LATE_PENDING: ("late_pending", _is_true),
    names.HEADER_SETTLES_AFTER_RUN: ("settles_after_run", _is_true),
    names.HEADER_CREATED: ("created", _epoch),
    names.HEADER_ENQUEUED: ("enqueued", _epoch),
    names.HEADER_RUN_S: ("run_s", _seconds),
    names.HEADER_TRACEPARENT: ("traceparent", _traceparent),
    names.HEADER_TRACESTATE: ("tracestate", _tracestate),
}
