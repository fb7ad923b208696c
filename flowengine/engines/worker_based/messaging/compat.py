"""Mixed fleets: flowengine and TaskFlow engines and workers on one exchange.

Both speak the same messages (queue names, properties, JSON bodies, schemas;
flowengine's extras are optional headers TaskFlow ignores), but by default
they *declare* the exchange and the topic queues differently: flowengine's
outlive their consumers (``auto_delete=False``, so requests waiting for a
restarting worker are kept), TaskFlow's are auto-deleted. RabbitMQ refuses a
re-declaration with other flags (PRECONDITION_FAILED) and so does kombu's
in-process ``memory`` transport (NotEquivalentError), so whichever side comes
second fails. ``compat='taskflow'`` makes flowengine declare exactly what
TaskFlow declares. Every flowengine process on an exchange shared with
TaskFlow must use it (the declarations must agree everywhere).

Features that need flowengine on both ends degrade to TaskFlow's behaviour
when the peer is TaskFlow, with one logged warning per peer. A peer is told
apart by the absence of flowengine's headers (``worker_id`` on a worker's
replies; ``origin`` on an engine's requests), whatever the compat setting.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from kombu.entity import Exchange

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.transports import topology

LOG = logging.getLogger(__name__)

#: The one compatibility mode: declare and behave like TaskFlow's worker-based engine.
TASKFLOW = "taskflow"

#: Accepted values of the ``compat`` option (None: flowengine's own choices).
MODES = (None, TASKFLOW)

#: How many distinct TaskFlow peers are remembered for warn-once logging:
#: bounded so a long-lived worker serving many short-lived TaskFlow engines
#: (one reply queue each) cannot grow without limit; past it, a peer may be
#: warned about twice, which is harmless.
MAX_REMEMBERED_PEERS = 1024

#: What a flowengine *engine* loses when a request is run by a TaskFlow worker.
LOST_WITH_TASKFLOW_WORKER = (
    "no RUNNING heartbeats, so a worker that dies while running a request is not"
    " noticed and the engine waits for it (TaskFlow's behaviour); the request's"
    " 'expires' header is ignored, so it may run after this engine gave up on it;"
    " time limits, events and duplicate suppression are not applied"
)

#: What a flowengine *worker* loses when a request comes from a TaskFlow engine.
LOST_WITH_TASKFLOW_ENGINE = (
    "it carries no 'expires', 'attempt' or trace headers, so it runs even if"
    " that engine stopped waiting, and the engine re-sends nothing when this"
    " worker dies while running it (TaskFlow's behaviour)"
)


def check(compat: str | None, durable: bool = False, signed: bool = False) -> str | None:
    """Validate a ``compat`` value against the other settings; return it normalised.

    Raises ValueError for an unknown mode, and for settings TaskFlow peers
    cannot follow: durable declarations (TaskFlow's are transient, and the
    broker refuses the mismatch) and message signing (TaskFlow never signs,
    so a signing receiver would refuse every TaskFlow message).
    """
    if isinstance(compat, str):
        compat = compat.strip().lower() or None
        if compat == "none":
            compat = None
    if compat not in MODES:
        raise ValueError(
            f"Unknown compat mode {compat!r}; expected one of {[m for m in MODES if m]} or None"
        )
    if compat == TASKFLOW and durable:
        raise ValueError(
            "compat='taskflow' cannot be combined with durable=True: TaskFlow"
            " declares a transient exchange and queues, and the broker refuses"
            " a declaration that differs"
        )
    if compat == TASKFLOW and signed:
        raise ValueError(
            "compat='taskflow' cannot be combined with message signing:"
            " TaskFlow never signs, so every TaskFlow message would be refused;"
            " unset the secret (and FLOWENGINE_SECRET/FLOWENGINE_SECRET_FILE)"
            " until the fleet is all flowengine"
        )
    return compat


def make_exchange(
    name: str, durable: bool = False, compat: str | None = None, signed: bool = False
) -> Exchange:
    """The exchange as this compat mode declares it (TaskFlow's: auto-deleted)."""
    compat = check(compat, durable=durable, signed=signed)
    exchange = topology.make_exchange(name, durable=durable)
    if compat == TASKFLOW:
        exchange.auto_delete = True
    return exchange


def topic_queue_auto_delete(compat: str | None) -> bool:
    """Whether a worker's shared topic queue is auto-deleted (TaskFlow's is)."""
    return check(compat) == TASKFLOW


def reply_queue_outlives_connection(compat: str | None) -> bool:
    """Whether an engine's reply queue outlives its consumer's connection (topology).

    Not with TaskFlow workers: each of their replies declares the reply
    queue as TaskFlow does (auto-deleted), and RabbitMQ refuses a
    declaration that differs.
    """
    return check(compat) != TASKFLOW


def is_taskflow_peer(headers: Mapping[str, Any] | None, role: str) -> bool:
    """True when a message lacks the headers a flowengine ``role`` always sends.

    ``role`` is who sent it: ``'worker'`` (replies carry ``worker_id``) or
    ``'engine'`` (requests carry ``origin``).
    """
    headers = headers or {}
    if role == "worker":
        return pr.HEADER_WORKER_ID not in headers
    if role == "engine":
        return pr.HEADER_ORIGIN not in headers and pr.HEADER_ATTEMPT not in headers
    raise ValueError(f"Unknown role {role!r}; expected 'worker' or 'engine'")


class _WarnOnce:
    """Remembers (bounded, LRU) which peers were already warned about."""

    def __init__(self, limit: int = MAX_REMEMBERED_PEERS) -> None:
        self._seen: OrderedDict[Any, None] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def first(self, key: Any) -> bool:
        """True the first time ``key`` is seen (while it is remembered)."""
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return False
            self._seen[key] = None
            if len(self._seen) > self._limit:
                self._seen.popitem(last=False)
            return True


_WARNED = _WarnOnce()


def note_reply(
    headers: Mapping[str, Any] | None, executor_uuid: str, topic: str | None, request: Any
) -> bool:
    """Engine side: a reply arrived; warn once per (engine, topic) if a TaskFlow worker sent it.

    Returns True when the sender is a TaskFlow worker.
    """
    if not is_taskflow_peer(headers, "worker"):
        return False
    if _WARNED.first(("worker", executor_uuid, topic)):
        LOG.warning(
            "Request %s is run by a TaskFlow worker on topic %r (its reply has no"
            " '%s' header); for requests on such workers this engine degrades to"
            " TaskFlow's behaviour: %s",
            request,
            topic,
            pr.HEADER_WORKER_ID,
            LOST_WITH_TASKFLOW_WORKER,
        )
    return True


def note_request(
    headers: Mapping[str, Any] | None, reply_to: str, worker_id: str, request_uuid: str
) -> bool:
    """Worker side: a request arrived; warn once per engine if a TaskFlow engine sent it.

    Returns True when the sender is a TaskFlow engine.
    """
    if not is_taskflow_peer(headers, "engine"):
        return False
    if _WARNED.first(("engine", worker_id, reply_to)):
        LOG.warning(
            "Worker %s: request %s comes from a TaskFlow engine (reply_to %r, no"
            " flowengine headers); %s",
            worker_id,
            request_uuid,
            reply_to,
            LOST_WITH_TASKFLOW_ENGINE,
        )
    return True


__all__ = [
    "LOST_WITH_TASKFLOW_ENGINE",
    "LOST_WITH_TASKFLOW_WORKER",
    "MODES",
    "TASKFLOW",
    "check",
    "is_taskflow_peer",
    "make_exchange",
    "note_reply",
    "note_request",
    "topic_queue_auto_delete",
]
