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

# This module is the event stream's public face: every name is defined in one
# of the modules below (one concern each) and re-exported here:
#   event_format     event types, standard fields, Lamport clock, timings
#   event_channel    the events exchange and connections to it
#   event_publisher  EventPublisher and its buffer/flush tunables
#   event_receiver   EventReceiver, its queue limits, body decoding
#   event_signing    what an event's signature covers

from __future__ import annotations

import logging

from flowengine.engines.worker_based import event_channel as _channel
from flowengine.engines.worker_based import event_format as _format
from flowengine.engines.worker_based import event_publisher as _publisher
from flowengine.engines.worker_based import event_receiver as _receiver
from flowengine.engines.worker_based.event_channel import events_exchange_name
from flowengine.engines.worker_based.event_format import (
    EVENT_TYPES,
    FLOW_EVENTS,
    HEADER_ENQUEUED,
    TASK_EVENTS,
    LamportClock,
    default_hostname,
    request_timings,
    timing_headers,
    utcoffset_hours,
)
from flowengine.engines.worker_based.event_publisher import EventPublisher
from flowengine.engines.worker_based.event_receiver import EventReceiver

LOG = logging.getLogger(__name__)

# Documented constants are bound by assignment, not import: the API docs read
# a constant's ``#:`` comment from the module that documents it, this one.
# tests/worker_based/test_facades.py keeps these comments equal to the
# defining modules'.

#: Suffix of the events exchange name (``<exchange>.events``): the task
#: exchange is direct, so events need an exchange of their own to fan out.
EVENTS_EXCHANGE_SUFFIX = _channel.EVENTS_EXCHANGE_SUFFIX

#: Events a publisher holds while its thread is behind; past this they are
#: dropped (a slow or absent broker must not grow a worker's memory).
EVENT_BUFFER_SIZE = _publisher.EVENT_BUFFER_SIZE

#: Messages a receiver's queue keeps on brokers that honour a length limit
#: (RabbitMQ): a stalled viewer must not fill the broker.
RECEIVER_QUEUE_MAX_LENGTH = _receiver.RECEIVER_QUEUE_MAX_LENGTH

#: Milliseconds an event may wait in a receiver's queue (RabbitMQ): older
#: events describe a past no live view needs.
RECEIVER_MESSAGE_TTL_MS = _receiver.RECEIVER_MESSAGE_TTL_MS

#: Seconds between worker-heartbeat events: often enough for a live view to
#: tell a silent worker from a dead one within a few seconds.
HEARTBEAT_PERIOD_S = _format.HEARTBEAT_PERIOD_S

#: Seconds a publisher waits for its buffer to drain on close().
CLOSE_FLUSH_S = _publisher.CLOSE_FLUSH_S

#: Seconds a receiver's loop waits for a message before checking for stop().
RECEIVE_POLL_S = _receiver.RECEIVE_POLL_S

#: Seconds a publisher waits before reconnecting after a broker error.
RECONNECT_DELAY_S = _publisher.RECONNECT_DELAY_S

#: Seconds between warnings about dropped unverified events: the first one
#: is logged at once, then at most one per period (with the running count),
#: so a flood of forged events cannot flood the log too.
UNVERIFIED_WARNING_PERIOD_S = _receiver.UNVERIFIED_WARNING_PERIOD_S

#: Event types, by sender.
WORKER_EVENTS = _format.WORKER_EVENTS

#: Task event types after which a request sends nothing more.
TERMINAL_TASK_EVENTS = _format.TERMINAL_TASK_EVENTS

#: Request headers carrying RQ-style timings (epoch seconds) to the worker.
HEADER_CREATED = _format.HEADER_CREATED

#: Standard fields every event has.
STANDARD_FIELDS = _format.STANDARD_FIELDS

# Private names the module had before the split (tests decode through one).
_connection = _channel.connection
_exchange = _channel.exchange
_release = _channel.release
_decode = _receiver.decode
_forget_queue = _receiver.forget_queue

# In the order the API docs list them (the order of the module before the split).
__all__ = [
    "EVENTS_EXCHANGE_SUFFIX", "EVENT_BUFFER_SIZE", "RECEIVER_QUEUE_MAX_LENGTH",
    "RECEIVER_MESSAGE_TTL_MS", "HEARTBEAT_PERIOD_S", "CLOSE_FLUSH_S", "RECEIVE_POLL_S",
    "RECONNECT_DELAY_S", "UNVERIFIED_WARNING_PERIOD_S", "WORKER_EVENTS", "TASK_EVENTS",
    "FLOW_EVENTS", "EVENT_TYPES",
    "TERMINAL_TASK_EVENTS", "HEADER_CREATED", "HEADER_ENQUEUED", "STANDARD_FIELDS",
    "events_exchange_name", "utcoffset_hours", "default_hostname", "LamportClock",
    "EventPublisher", "EventReceiver", "request_timings", "timing_headers",
]
