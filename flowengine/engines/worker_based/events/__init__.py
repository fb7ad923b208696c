"""Event stream: JSON events about workers, requests and flows on a fanout exchange.

Workers and engines publish what happens (``worker-online``,
``task-started``, ``flow-finished``, ...) on the exchange
``<exchange>.events``: fanout, non-durable, transient messages, so nothing is
kept when nobody listens. Every event is one JSON object with the standard
fields ``type``, ``hostname``, ``pid``, ``clock`` (the sender's Lamport
clock), ``timestamp`` (epoch seconds) and ``utcoffset`` (hours), plus the
fields of its type (request ``uuid``, ``name``, ``root_id``, ``attempt``,
``runtime``, ``created``/``enqueued``/``started``/``ended``, ...).

Publishing never blocks the caller on the broker: :meth:`EventPublisher.send`
stamps the event and puts it on a bounded buffer that one thread publishes;
when the buffer is full the event is dropped and counted. Receivers consume
from their own bounded, auto-deleted queue.

When a sender signs its messages (it has a keyring, see :mod:`.signing`), it
signs its events with the same keys; a receiver given a ``secret`` drops and
counts every event that is unsigned or not signed with one of its keys
(:attr:`EventReceiver.unverified_count`). Without a secret a receiver accepts
every event, so do not act on what it shows.
"""

# The package's public face: the names users reach for, each defined in one
# module of the package (model: event types, fields, clock, timings; channel:
# the events exchange; publisher; receiver; signing: what a signature covers;
# hooks: what engines say; a worker's events come from its middleware).

from __future__ import annotations

from flowengine.engines.worker_based.events.channel import events_exchange_name
from flowengine.engines.worker_based.events.model import (
    EVENT_TYPES,
    FLOW_EVENTS,
    STANDARD_FIELDS,
    TASK_EVENTS,
    TERMINAL_TASK_EVENTS,
    WORKER_EVENTS,
    LamportClock,
    default_hostname,
    request_timings,
    timing_headers,
    utcoffset_hours,
)
from flowengine.engines.worker_based.events.publisher import EventPublisher
from flowengine.engines.worker_based.events.receiver import EventReceiver

# The request headers carrying RQ-style timings (epoch seconds) to the
# worker: named with the other headers, in the wire package.
from flowengine.engines.worker_based.wire.names import HEADER_CREATED, HEADER_ENQUEUED

__all__ = [
    "EVENT_TYPES",
    "FLOW_EVENTS",
    "HEADER_CREATED",
    "HEADER_ENQUEUED",
    "STANDARD_FIELDS",
    "TASK_EVENTS",
    "TERMINAL_TASK_EVENTS",
    "WORKER_EVENTS",
    "EventPublisher",
    "EventReceiver",
    "LamportClock",
    "default_hostname",
    "events_exchange_name",
    "request_timings",
    "timing_headers",
    "utcoffset_hours",
]
