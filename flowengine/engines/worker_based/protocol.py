"""The wire protocol between executors and workers: states, messages, schemas.

Every message body is JSON and is validated on receipt with a jsonschema
validator compiled once at import; nested parts (failure dicts inside
responses and revert requests) are validated too, before anything acts on
them. flowengine's additions travel as optional message headers (the names
are the ``HEADER_*`` constants below), never as new required body fields, so
a TaskFlow peer's messages stay valid.
"""

# This module is the protocol's public face: every name is defined in one of
# the modules below (one concern each) and re-exported here, so code, tests
# and docs keep importing from ``protocol``:
#   wire_names       states, actions, message types, headers, queue names
#   request_machine  the request state machine and its transition table
#   wire_schemas     body schemas, compiled validators, validation fast paths
#   wire_failures    failures to and from JSON dicts
#   wire_messages    Message, Notify, Response
#   wire_request     Request, WorkUnit

from __future__ import annotations

import logging

from flowengine.engines.worker_based import request_machine as _machine
from flowengine.engines.worker_based import wire_failures as _failures
from flowengine.engines.worker_based import wire_names as _names
from flowengine.engines.worker_based import wire_schemas as _schemas
from flowengine.engines.worker_based.request_machine import build_a_machine, make_an_event
from flowengine.engines.worker_based.wire_failures import failure_to_dict
from flowengine.engines.worker_based.wire_messages import Message, Notify, Response
from flowengine.engines.worker_based.wire_names import (
    EVENT,
    EXECUTE,
    EXECUTED,
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
    NOTIFY,
    PENDING,
    REQUEST,
    RESPONSE,
    REVERT,
    REVERTED,
    RUNNING,
    SUCCESS,
    WAITING,
    make_origin,
    make_worker_id,
    parse_expires,
    reply_queue_name,
    topic_queue_name,
    worker_queue_name,
    worker_routing_key,
)
from flowengine.engines.worker_based.wire_request import Request, WorkUnit

# The same logger the request transitions log to (see wire_request).
LOG = logging.getLogger(__name__)

# Documented constants are bound by assignment, not import: the API docs read
# a constant's ``#:`` comment from the module that documents it, this one.
# tests/worker_based/test_facades.py keeps these comments equal to the
# defining module's.

#: Remote task action -> outcome tag of the request's future.
ACTION_TO_EVENT = _names.ACTION_TO_EVENT

#: Largest message body (bytes) a worker accepts: anything larger is rejected
#: unread, so one oversized message cannot exhaust a worker's memory or time.
MAX_BODY_BYTES = _names.MAX_BODY_BYTES

#: Routing key every executor's reply queue is also bound to; workers publish
#: their announcements (start, periodic refresh, leaving) there.
ANNOUNCE_ROUTING_KEY = _names.ANNOUNCE_ROUTING_KEY

#: Marker meaning "no result given" (None is a valid result).
NO_RESULT = _names.NO_RESULT

# Public names outside __all__ (tunables, state groups, TaskFlow's names).
WAITING_STATES = _names.WAITING_STATES
STOP_TIMER_STATES = _names.STOP_TIMER_STATES
REQUEST_TIMEOUT_S = _names.REQUEST_TIMEOUT_S
REQUEST_TIMEOUT = _names.REQUEST_TIMEOUT
NOTIFY_PERIOD_S = _names.NOTIFY_PERIOD_S
NOTIFY_PERIOD = _names.NOTIFY_PERIOD
EXPIRES_AFTER_S = _names.EXPIRES_AFTER_S
EXPIRES_AFTER = _names.EXPIRES_AFTER

# Private names the module had before the split; tests check the fast paths
# against the validators through them.
_MACHINE = _machine.MACHINE
_TRANSITIONS = _machine.TRANSITIONS
_json_check = _failures._json_check
_validate_failure = _failures.validate_failure
_compile = _schemas.compile_schema
_check = _schemas.check
_response_fast = _schemas.response_fast
_request_fast = _schemas.request_fast
_RESPONSE_STATES = _schemas._RESPONSE_STATES
_COMPLETION_KEYS = _schemas._COMPLETION_KEYS
_EVENT_KEYS = _schemas._EVENT_KEYS
_REQUEST_ACTIONS = _schemas._REQUEST_ACTIONS
_NOTIFY_RESPONSE_VALIDATOR = _schemas.NOTIFY_RESPONSE_VALIDATOR
_NOTIFY_SENDER_VALIDATOR = _schemas.NOTIFY_SENDER_VALIDATOR
_REQUEST_VALIDATOR = _schemas.REQUEST_VALIDATOR
_RESPONSE_VALIDATOR = _schemas.RESPONSE_VALIDATOR

# TaskFlow exposes the work unit under this private-looking name; keep an alias.
_WorkUnit = WorkUnit

__all__ = [
    "ACTION_TO_EVENT", "ANNOUNCE_ROUTING_KEY", "EVENT", "EXECUTE", "EXECUTED", "FAILURE",
    "HEADER_ATTEMPT", "HEADER_EXPIRES", "HEADER_LEAVING", "HEADER_NAMES", "HEADER_ORIGIN",
    "HEADER_PARENT_ID", "HEADER_ROOT_ID", "HEADER_TIMELIMIT", "HEADER_WORKER_ID",
    "MAX_BODY_BYTES", "Message", "NO_RESULT", "NOTIFY", "Notify", "PENDING", "REQUEST",
    "RESPONSE", "REVERT", "REVERTED", "RUNNING", "Request", "Response", "SUCCESS", "WAITING",
    "WorkUnit", "build_a_machine", "failure_to_dict", "make_an_event", "make_origin",
    "make_worker_id", "parse_expires", "reply_queue_name", "topic_queue_name",
    "worker_queue_name", "worker_routing_key",
]
