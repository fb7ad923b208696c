"""Names and values on the wire: states, actions, message types, headers, queues.

Everything here is a plain value (or a function computing one) that both
ends of the protocol must agree on; the public face of these names is
:mod:`flowengine.engines.worker_based.protocol`, which re-exports them.
"""

from __future__ import annotations

import datetime
import os
import socket
import uuid as uuidlib
from typing import Any

from flowengine import exceptions as exc

# Request states (protocol states, not task states) and the EVENT pseudo-state
# a worker uses to forward task notifications (progress) to the executor.
WAITING = "WAITING"
PENDING = "PENDING"
RUNNING = "RUNNING"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
EVENT = "EVENT"

#: States in which a request can still expire (nobody has started it yet).
WAITING_STATES = (WAITING, PENDING)

#: Once one of these is entered the expiry no longer applies.
STOP_TIMER_STATES = (RUNNING, SUCCESS, FAILURE)

# Remote task actions.
EXECUTE = "execute"
REVERT = "revert"

# Outcome tags the request future resolves with; the same values as
# flowengine.engines.action_engine.executor.EXECUTED/REVERTED (kept literal
# here so the protocol does not import the local engine).
EXECUTED = "executed"
REVERTED = "reverted"

#: Remote task action -> outcome tag of the request's future.
ACTION_TO_EVENT = {EXECUTE: EXECUTED, REVERT: REVERTED}

# Message types (the AMQP 'type' property of every message).
NOTIFY = "NOTIFY"
REQUEST = "REQUEST"
RESPONSE = "RESPONSE"

#: Seconds a request may stay in WAITING/PENDING before it fails with
#: RequestTimeout; TaskFlow's default, so TaskFlow programs behave the same.
REQUEST_TIMEOUT_S = 60
REQUEST_TIMEOUT = REQUEST_TIMEOUT_S  # TaskFlow's name

#: Seconds between discovery refreshes (NOTIFY to topics / worker re-announce);
#: TaskFlow's period. Discovery of a *new* worker never waits on it: workers
#: announce themselves when they start.
NOTIFY_PERIOD_S = 5.0
NOTIFY_PERIOD = NOTIFY_PERIOD_S  # TaskFlow's name

#: Seconds of silence after which a worker is forgotten (TaskFlow's default).
EXPIRES_AFTER_S = 60.0
EXPIRES_AFTER = EXPIRES_AFTER_S  # TaskFlow's name

#: Largest message body (bytes) a worker accepts: anything larger is rejected
#: unread, so one oversized message cannot exhaust a worker's memory or time.
MAX_BODY_BYTES = 8 * 1024 * 1024

#: Routing key every executor's reply queue is also bound to; workers publish
#: their announcements (start, periodic refresh, leaving) there.
ANNOUNCE_ROUTING_KEY = "flowengine.announce"

# Header names (flowengine extras; all optional on receipt).
HEADER_EXPIRES = "expires"  # absolute deadline: epoch seconds or ISO 8601
HEADER_ATTEMPT = "attempt"  # how many times this request was dispatched before
HEADER_ROOT_ID = "root_id"  # flow uuid the request belongs to (tracing)
HEADER_PARENT_ID = "parent_id"  # flow detail / parent uuid (tracing)
HEADER_ORIGIN = "origin"  # "hostname:pid" of the sender
HEADER_TIMELIMIT = "timelimit"  # [soft, hard] seconds, or null
HEADER_WORKER_ID = "worker_id"  # unique id of the worker process that sent it
HEADER_LEAVING = "leaving"  # True on a worker's goodbye announcement
HEADER_CREATED = "created"  # epoch seconds the engine created the request (timings)
HEADER_ENQUEUED = "enqueued"  # epoch seconds this dispatch was published (timings)
HEADER_RUN_S = "run_s"  # seconds an outcome's body ran on its worker (timings)
# On a PENDING reply: the worker got the request as a redelivery and did not
# run it; its engine sends it again if, and only if, it still waits for it.
HEADER_DECLINED = "declined"
# On a request: its engine takes no PENDING for it from a worker that answers
# it within RUNNING_REPLY_DELAY_S of taking it (engine option late_pending);
# the worker tells PENDING (or RUNNING) only if it still holds it then.
HEADER_LATE_PENDING = "late_pending"
# On a worker's announcement and NOTIFY reply: it acknowledges a late request
# it runs on its consume loop only once the outcome is sent, so the broker
# gives it back if the worker goes first (RabbitMQ; see worker_side/intake.py).
# An engine whose late_pending option is left to it (None) asks for a late
# PENDING only where every worker that may take the request says so.
HEADER_SETTLES_AFTER_RUN = "settles_after_run"
# W3C Trace Context of the engine's span for the request's atom (OpenTelemetry,
# the otel extra; see flowengine.tracing): standard names, ignored by TaskFlow.
HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"
HEADER_NAMES = (
    HEADER_EXPIRES,
    HEADER_ATTEMPT,
    HEADER_ROOT_ID,
    HEADER_PARENT_ID,
    HEADER_ORIGIN,
    HEADER_TIMELIMIT,
    HEADER_WORKER_ID,
    HEADER_LEAVING,
)

#: Marker meaning "no result given" (None is a valid result).
NO_RESULT = object()


# --- names of queues and routing keys (see the contract's wire details) ---


def topic_queue_name(exchange: str, topic: str) -> str:
    """Queue shared by all workers of a topic (competing consumers)."""
    return f"{exchange}_{topic}"


def worker_routing_key(topic: str, worker_id: str) -> str:
    """Routing key reaching exactly one worker of a topic."""
    return f"{topic}.{worker_id}"


def worker_queue_name(exchange: str, topic: str, worker_id: str) -> str:
    """Private queue of one worker (auto-deleted with it)."""
    return f"{exchange}_{topic}.{worker_id}"


def reply_queue_name(exchange: str, executor_uuid: str) -> str:
    """Reply queue of an executor (its routing key is the executor uuid)."""
    return f"{exchange}_{executor_uuid}"


def make_origin() -> str:
    """The ``origin`` header value of this process: ``hostname:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def make_worker_id() -> str:
    """A worker id unique per worker object: ``hostname:pid:8 hex chars``."""
    return f"{make_origin()}:{uuidlib.uuid4().hex[:8]}"


def parse_expires(value: Any) -> float | None:
    """Turn an ``expires`` header (epoch seconds or ISO 8601) into epoch seconds.

    Returns None when absent; raises InvalidFormat when it cannot be read.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise exc.InvalidFormat(f"Header '{HEADER_EXPIRES}' must be a time, not {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise exc.InvalidFormat(
                f"Header '{HEADER_EXPIRES}' is not epoch seconds nor ISO 8601: {value!r}"
            )
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return when.timestamp()
    raise exc.InvalidFormat(
        f"Header '{HEADER_EXPIRES}' must be a number or a string, not {type(value).__name__}"
    )
