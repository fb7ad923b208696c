"""The wire protocol between executors and workers: states, messages, schemas.

Every message body is JSON and is validated on receipt with a jsonschema
validator compiled once at import; nested parts (failure dicts inside
responses and revert requests) are validated too, before anything acts on
them. flowengine's additions travel as optional message headers (the names
are the ``HEADER_*`` constants below), never as new required body fields, so
a TaskFlow peer's messages stay valid.
"""

# TaskFlow's module path for the protocol. Each name is defined in the wire
# package (one concern a module: names, machine, schemas, failures, messages,
# request) and imported here, so TaskFlow's ``protocol.X`` keeps working.

from __future__ import annotations

from flowengine.engines.worker_based.wire.failures import failure_to_dict
from flowengine.engines.worker_based.wire.machine import build_a_machine, make_an_event
from flowengine.engines.worker_based.wire.messages import Message, Notify, Response
from flowengine.engines.worker_based.wire.names import (
    ACTION_TO_EVENT,
    ANNOUNCE_ROUTING_KEY,
    EVENT,
    EXECUTE,
    EXECUTED,
    EXPIRES_AFTER,
    EXPIRES_AFTER_S,
    FAILURE,
    HEADER_ATTEMPT,
    HEADER_EXPIRES,
    HEADER_LEAVING,
    HEADER_NAMES,
    HEADER_ORIGIN,
    HEADER_PARENT_ID,
    HEADER_ROOT_ID,
    HEADER_TIMELIMIT,
    HEADER_WORKER_ID,
    MAX_BODY_BYTES,
    NO_RESULT,
    NOTIFY,
    NOTIFY_PERIOD,
    NOTIFY_PERIOD_S,
    PENDING,
    REQUEST,
    REQUEST_TIMEOUT,
    REQUEST_TIMEOUT_S,
    RESPONSE,
    REVERT,
    REVERTED,
    RUNNING,
    STOP_TIMER_STATES,
    SUCCESS,
    WAITING,
    WAITING_STATES,
    make_origin,
    make_worker_id,
    parse_expires,
    reply_queue_name,
    topic_queue_name,
    worker_queue_name,
    worker_routing_key,
)
from flowengine.engines.worker_based.wire.request import Request, WorkUnit

# TaskFlow's name for the work unit.
_WorkUnit = WorkUnit

__all__ = [
    "_WorkUnit",
    "ACTION_TO_EVENT",
    "ANNOUNCE_ROUTING_KEY",
    "build_a_machine",
    "EVENT",
    "EXECUTE",
    "EXECUTED",
    "EXPIRES_AFTER",
    "EXPIRES_AFTER_S",
    "FAILURE",
    "failure_to_dict",
    "HEADER_ATTEMPT",
    "HEADER_EXPIRES",
    "HEADER_LEAVING",
    "HEADER_NAMES",
    "HEADER_ORIGIN",
    "HEADER_PARENT_ID",
    "HEADER_ROOT_ID",
    "HEADER_TIMELIMIT",
    "HEADER_WORKER_ID",
    "make_an_event",
    "make_origin",
    "make_worker_id",
    "MAX_BODY_BYTES",
    "Message",
    "NO_RESULT",
    "Notify",
    "NOTIFY",
    "NOTIFY_PERIOD",
    "NOTIFY_PERIOD_S",
    "parse_expires",
    "PENDING",
    "reply_queue_name",
    "REQUEST",
    "Request",
    "REQUEST_TIMEOUT",
    "REQUEST_TIMEOUT_S",
    "RESPONSE",
    "Response",
    "REVERT",
    "REVERTED",
    "RUNNING",
    "STOP_TIMER_STATES",
    "SUCCESS",
    "topic_queue_name",
    "WAITING",
    "WAITING_STATES",
    "worker_queue_name",
    "worker_routing_key",
    "WorkUnit",
]
