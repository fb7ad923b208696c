"""Generated poison messages against every consume loop, on every broker (issue 35).

Hypothesis builds kombu messages with arbitrary properties, headers and
bodies (every field: content type and encoding, a ``compression`` header
over compressed or plain bodies, headers that are not a mapping and header
values of every type, priority, delivery mode, expiration, user id,
``type``/``correlation_id``/``reply_to`` of wrong types, bodies of random
bytes, of JSON of any shape, of near-valid protocol bodies that fail their
schema or pass it, oversized, pickled, empty) and publishes them with raw
kombu (a channel's ``prepare_message``/``basic_publish``: what
``Producer.publish`` calls, without its conversions) into:

* a worker's topic queue (routing key: the topic),
* its private queue (``<topic>.<worker_id>``, and the topic's broadcast key),
* its control queue (``flowengine.control`` and ``flowengine.control.<worker_id>``),
* the reply queue of an engine running a flow (routing key: its executor uuid),
* the events exchange (``<exchange>.events``), read by an event receiver,

while the engine's flow of 20 tasks runs on that worker (a real ``flowengine
worker`` process, except on the in-process memory transport). A message the
client library or the broker refuses at publish time is counted as such
(AMQP cannot carry some property types; RabbitMQ refuses a forged user id or
a malformed expiration), not as a failure.

Each Hypothesis example is one message (explicit ones first: cases that
broke consume loops); every PER_BATCH of them make a batch. After each
batch: the worker process, its control
loop, the engine and the event receiver are alive; every queue is drained;
every message the test's own oracle says a consume loop must refuse sits in
the right dead-letter queue exactly once (the others, valid by chance, were
answered or ignored, or refused for reasons the oracle does not model); the
engine finished its flow with every result right; and a normal flow then
completes on the same worker; and nothing logged an error. A summary per
broker is printed (``-s``) and written to ``/tmp/poison_summary_<broker>.txt``.

Found this way: Redis and filesystem transports dropped (instead of
delivering) a message whose headers or properties held a mapping kombu's
JSON reads as a type tag it cannot decode; py-amqp raised on a property
that is not UTF-8, so RabbitMQ redelivered the message to a failing loop
for ever; and (still open, see the xfail test at the end) py-amqp raises on
a routing key that is not UTF-8, which kills an event receiver.
"""

from __future__ import annotations

import bz2
import collections
import contextlib
import dataclasses
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import types
import zlib
from collections.abc import Iterator
from typing import Any

import jsonschema
import kombu
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from flowengine import engines
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.events import channel as events_channel
from flowengine.engines.worker_based.events import receiver as events_receiver
from flowengine.engines.worker_based.messaging import consumer as consumer_mod
from flowengine.engines.worker_based.messaging import control_client, inventory
from flowengine.engines.worker_based.messaging import dead_letters as dl
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import control as wc
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import names, schemas
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from tests import waiting
from tests.proc_utils import stop_processes
from tests.worker_based import poison_tasks as pt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

TOPIC = "poison"

#: Largest body the worker and the engine take (small, so that oversized
#: bodies cost little to generate and to send).
LIMIT = 4096

#: Batches per broker, and messages (Hypothesis examples) per batch.
BATCHES = 5
PER_BATCH = 100

#: Tasks of the flow an engine runs during each flood: a gate, 18 adders, a gate.
ADDERS = 18

#: Bound (s) on every wait: only so that a bug fails the test instead of hanging it.
WAIT_S = 60.0

TARGET_TOPIC = "topic"
TARGET_PRIVATE = "private"
TARGET_BROADCAST = "broadcast"  # the topic's broadcast key: the worker's private queue
TARGET_CONTROL = "control"  # every worker's control key
TARGET_CONTROL_OWN = "control-own"  # this worker's control key
TARGET_REPLY = "reply"  # the engine's reply queue
TARGET_EVENTS = "events"
TARGETS = (
    TARGET_TOPIC,
    TARGET_PRIVATE,
    TARGET_BROADCAST,
    TARGET_CONTROL,
    TARGET_CONTROL_OWN,
    TARGET_REPLY,
    TARGET_EVENTS,
)

#: Where a publish went: sent, or refused before reaching a queue.
SENT = "sent"
REFUSED_BY_CLIENT = "refused by the client"
REFUSED_BY_BROKER = "refused by the broker"


# --- what each consume loop accepts (the test's own oracle) -------------------


def _validator(schema: dict[str, Any]) -> Any:
    return jsonschema.Draft4Validator(schema)


_REQUEST_OK = _validator(schemas.REQUEST_SCHEMA)
_RESPONSE_OK = _validator(schemas.RESPONSE_SCHEMA)
_NOTIFY_SENDER_OK = _validator(schemas.NOTIFY_SENDER_SCHEMA)
_NOTIFY_RESPONSE_OK = _validator(schemas.NOTIFY_RESPONSE_SCHEMA)
_CONTROL_OK = _validator(wc.REQUEST_SCHEMA)

#: Per queue kind: message type -> (required properties, schema check of the body).
_WORKER_TYPES = {
    pr.REQUEST: (("reply_to", "correlation_id"), _REQUEST_OK.is_valid),
    pr.NOTIFY: (("reply_to",), _NOTIFY_SENDER_OK.is_valid),
}
_CONTROL_TYPES = {wc.CONTROL: ((), _CONTROL_OK.is_valid)}
_REPLY_TYPES = {
    pr.RESPONSE: (
        ("correlation_id",),
        lambda data: _RESPONSE_OK.is_valid(pr.Response.normalize(data)),
    ),
    pr.NOTIFY: ((), _NOTIFY_RESPONSE_OK.is_valid),
}
ACCEPTED_TYPES = {
    TARGET_TOPIC: _WORKER_TYPES,
    TARGET_PRIVATE: _WORKER_TYPES,
    TARGET_BROADCAST: _WORKER_TYPES,
    TARGET_CONTROL: _CONTROL_TYPES,
    TARGET_CONTROL_OWN: _CONTROL_TYPES,
    TARGET_REPLY: _REPLY_TYPES,
}


def _refusal_of(body: Any, poison: Poison) -> str | None:
    """Why a consume loop must refuse ``poison`` received with ``body``; None: it may not."""
    headers = poison.headers
    if headers and not isinstance(headers, dict):
        return "headers not a mapping"
    if isinstance(headers, dict) and headers.get("compression") is not None:
        return "compressed"
    if len(body) > LIMIT:
        return "oversized"
    if poison.content_type != "application/json":
        # kombu's accept list refuses it, or (application/data, /text, none)
        # hands over a string every schema refuses.
        return "content type"
    if body:
        try:
            data = kombu_json.loads(body)
        except Exception:
            return "undecodable body"
    else:
        data = body  # kombu hands an empty body over as it is
    props = poison.properties
    message_type = props.get("type")
    if not message_type or not isinstance(message_type, str):
        return "type property"
    if any(
        props.get(p) is not None and not isinstance(props[p], str)
        for p in ("reply_to", "correlation_id")
    ):
        return "mistyped property"
    accepted = ACCEPTED_TYPES[poison.target]
    if message_type not in accepted:
        return "unexpected type"
    required, valid = accepted[message_type]
    if any(not props.get(p) for p in required):
        return "missing property"
    if not valid(data):
        return "schema"
    return None


def _as_amqp_carries(properties: dict[str, Any]) -> dict[str, Any]:
    """``properties`` after a trip through py-amqp's frame encoding (as sent if it cannot)."""
    from amqp.basic_message import Message

    try:
        raw = Message(b"", **properties)._serialize_properties()
        received = Message()
        received._load_properties(received.CLASS_ID, raw, 0)
    except Exception:  # refused by the client when published: nothing is received
        return properties
    return dict(received.properties)


def must_refuse(poison: Poison, kind: str) -> str | None:
    """Why ``poison`` must be dead-lettered on broker ``kind``; None when it need not be.

    On AMQP, py-amqp decodes a body with its content encoding when it can,
    so a message must be refused both as sent and as decoded.
    """
    if poison.target == TARGET_EVENTS:
        return None
    if kind == "amqp":
        # The worker reads the properties the wire carries, not those sent:
        # py-amqp writes a falsy one as its empty form (correlation_id=0 -> '').
        poison = dataclasses.replace(poison, properties=_as_amqp_carries(poison.properties))
    reason = _refusal_of(poison.body, poison)
    if reason is None or kind != "amqp" or not isinstance(poison.content_encoding, str):
        return reason
    try:
        decoded = poison.body.decode(poison.content_encoding)
    except Exception:
        return reason
    return reason if _refusal_of(decoded, poison) is not None else None


# --- strategies ------------------------------------------------------------------

KNOWN_TYPES = (
    pr.REQUEST,
    pr.RESPONSE,
    pr.NOTIFY,
    wc.CONTROL,
    wc.CONTROL_REPLY,
    consumer_mod.WAKE_TYPE,
)

#: Header names flowengine reads (their values are fuzzed like any other).
HEADER_NAMES = (
    *names.HEADER_NAMES,
    names.HEADER_CREATED,
    names.HEADER_ENQUEUED,
    names.HEADER_RUN_S,
    names.HEADER_DECLINED,
    lv.HEADER_HEARTBEAT,
    lv.HEADER_REQUEST_ID,
    lv.HEADER_HEARTBEAT_MISSES,
    lv.HEADER_LOST_AFTER,
    "signature",
    "signature_key_id",
    consumer_mod.WAKE_HEADER,
    dl.HEADER_REASON,
    dl.HEADER_QUEUE,
    "compression",
)

#: Names that appear in protocol bodies (so generated objects hit the schemas' keys).
FIELD_NAMES = (
    "task_cls",
    "task_name",
    "task_version",
    "action",
    "arguments",
    "result",
    "failures",
    "state",
    "data",
    "event_type",
    "details",
    "topic",
    "tasks",
    "command",
    "destination",
    "exc_type_names",
    "__type__",
    "__value__",
)

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.one_of(st.text(max_size=12), st.text(st.characters() | surrogates, max_size=6))
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), texts)
# kombu's JSON turns {"__type__": ..., "__value__": ...} into objects (or raises).
kombu_tagged = st.fixed_dictionaries(
    {
        "__type__": st.sampled_from(
            ["bytes", "base64", "datetime", "date", "time", "decimal", "uuid", "no-such-type"]
        ),
        "__value__": st.one_of(json_scalars, st.just("2026-05-22T10:00:00")),
    }
)
json_values = st.recursive(
    st.one_of(json_scalars, kombu_tagged),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELD_NAMES), texts), inner, max_size=4),
    ),
    max_leaves=10,
)


def weighted(*choices: tuple[int, Any]) -> Any:
    """A strategy drawing from one of ``choices``, (weight, strategy) pairs, by weight."""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(pool).flatmap(lambda strategy: strategy)


header_values = st.one_of(
    json_values,
    st.binary(max_size=8),
    st.datetimes(),
    st.decimals(places=3),
    st.uuids(),
    st.integers(2**63, 2**70),
    st.sets(st.integers(0, 9), max_size=2),
    st.tuples(st.integers(), texts),
    st.sampled_from([float("nan"), float("inf")]),
)
header_maps = st.dictionaries(
    st.one_of(st.sampled_from(HEADER_NAMES), texts, st.integers(0, 3)), header_values, max_size=5
)
headers_st = weighted(
    (3, st.none()),
    (1, st.just({})),
    (5, header_maps),
    # Not a mapping at all (AMQP cannot carry these; the others can).
    (
        1,
        st.one_of(
            st.lists(header_values, min_size=1, max_size=3),
            st.text(min_size=1, max_size=8),
            st.integers(1, 99),
        ),
    ),
)
compression_names = st.sampled_from(
    [
        "application/x-gzip",
        "zlib",
        "gzip",
        "bzip2",
        "application/x-bz2",
        "lzma",
        "br",
        "no-such-codec",
    ]
)

odd_values = st.one_of(
    st.integers(),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.binary(max_size=5),
    st.floats(),
    st.booleans(),
)
hex_ids = st.uuids().map(lambda u: u.hex)
correlation_ids = weighted((2, st.none()), (5, hex_ids), (1, texts), (1, odd_values))
content_types = weighted(
    (8, st.just("application/json")),
    (
        1,
        st.sampled_from(
            [
                "application/x-python-serialize",
                "application/x-yaml",
                "application/x-msgpack",
                "text/plain",
                "application/data",
                "application/text",
                "Application/JSON",
                "",
            ]
        ),
    ),
    (1, st.none()),
    (1, st.text(max_size=10)),
)
content_encodings = weighted(
    (6, st.just("utf-8")),
    (2, st.sampled_from(["binary", "latin-1", "utf-16", "ascii", "no-such-codec", "UTF-8", ""])),
    (1, st.none()),
)
priorities = weighted(
    (4, st.none()),
    (3, st.integers(0, 9)),
    (1, st.integers(-10, 1000)),
    (1, st.text(max_size=3)),
    (1, st.floats()),
    (1, st.lists(st.integers(), max_size=2)),
)
delivery_modes = weighted(
    (4, st.none()),
    (3, st.sampled_from([1, 2])),
    (1, st.integers(-3, 300)),
    (1, st.text(max_size=5)),
    (1, st.floats()),
)
# Long expirations only: a message must not expire before its consumer reads it.
expirations = weighted(
    (6, st.none()), (1, st.sampled_from(["600000", "abc", "-1", "1.5"])), (1, st.integers(1, 10**9))
)
user_ids = weighted((6, st.none()), (1, st.sampled_from(["guest", "mallory"])), (1, st.integers()))


def types_for(target: str) -> Any:
    """``type`` properties: mostly one the target's loop handles, else anything."""
    accepted = sorted(ACCEPTED_TYPES.get(target, {})) or list(KNOWN_TYPES)
    return weighted(
        (6, st.sampled_from(accepted)),
        (2, st.sampled_from(KNOWN_TYPES)),
        (1, st.just("")),
        (1, st.none()),
        (1, texts),
        (1, odd_values),
    )


#: Valid bodies of each kind, mutated below (some stay valid).
TEMPLATES: tuple[dict[str, Any], ...] = (
    {
        "task_cls": "tests.worker_based.poison_tasks.AddTo",
        "task_name": "tests.worker_based.poison_tasks.AddTo",
        "task_version": "1.0",
        "action": "execute",
        "arguments": {"start": 1, "n": 2},
    },
    {
        "task_cls": "no.such.Task",
        "task_name": "no.such.Task",
        "task_version": ["1", "0"],
        "action": "revert",
        "arguments": {},
        "result": ["success", 3],
        "failures": {},
    },
    {"state": "SUCCESS", "data": {"result": 42}},
    {"state": "RUNNING", "data": {}},
    {"state": "EVENT", "data": {"event_type": "progress", "details": {"progress": 0.5}}},
    {"state": "EVENT", "event_type": "progress", "details": {}},  # TaskFlow's flat EVENT
    {
        "state": "FAILURE",
        "data": {
            "result": {
                "exc_type_names": ["RuntimeError"],
                "exception_str": "x",
                "traceback_str": "",
            }
        },
    },
    {},
    {"topic": "elsewhere", "tasks": ["no.such.Task"]},
    {"command": "ping"},
    {"command": "stats", "arguments": {}, "destination": ["someone-else"]},
    {"command": "registered", "destination": None},
)


@st.composite
def near_valid(draw: Any) -> Any:
    """A protocol body with one change (or none): a key dropped, retyped or added."""
    body = dict(draw(st.sampled_from(TEMPLATES)))
    change = draw(st.sampled_from(["none", "drop", "retype", "add", "retype-nested"]))
    keys = sorted(body)
    if change == "drop" and keys:
        del body[draw(st.sampled_from(keys))]
    elif change == "retype" and keys:
        body[draw(st.sampled_from(keys))] = draw(json_values)
    elif change == "add":
        body[draw(st.sampled_from(FIELD_NAMES))] = draw(json_values)
    elif change == "retype-nested":
        nested = [k for k in keys if isinstance(body[k], dict)]
        if nested:
            key = draw(st.sampled_from(nested))
            inner = dict(body[key])
            inner[draw(st.one_of(st.sampled_from(FIELD_NAMES), texts))] = draw(json_values)
            body[key] = inner
    return body


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


def _padded(size: int) -> bytes:
    return _dumps({"state": "SUCCESS", "data": {"result": "x" * size}})


bodies = weighted(
    (6, st.tuples(st.just("near-valid json"), near_valid().map(_dumps))),
    (2, st.tuples(st.just("json"), json_values.map(_dumps))),
    (2, st.tuples(st.just("random bytes"), st.binary(max_size=200))),
    (1, st.tuples(st.just("text"), texts.map(lambda t: t.encode("utf-8", "surrogatepass")))),
    (
        1,
        st.tuples(
            st.just("utf-16 json"), near_valid().map(lambda v: json.dumps(v).encode("utf-16"))
        ),
    ),
    (1, st.tuples(st.just("oversized"), st.integers(LIMIT, 2 * LIMIT).map(_padded))),
    (1, st.tuples(st.just("zlib"), near_valid().map(lambda v: zlib.compress(_dumps(v))))),
    (1, st.tuples(st.just("bzip2"), near_valid().map(lambda v: bz2.compress(_dumps(v))))),
    (1, st.tuples(st.just("pickle"), st.just(pickle.dumps({"poison": True})))),
    (1, st.just(("empty", b""))),
)


@dataclasses.dataclass
class Poison:
    """One generated message: where it goes and everything it carries."""

    target: str
    body_kind: str
    body: bytes
    content_type: Any
    content_encoding: Any
    headers: Any
    priority: Any
    properties: dict[str, Any]
    #: Instead of the target's own (the events exchange's fanout takes any).
    routing_key: Any = None

    def summary(self) -> str:
        return (
            f"{self.target}: body={self.body_kind} {self.body[:60]!r}"
            f" content_type={self.content_type!r}"
            f" content_encoding={self.content_encoding!r} headers={self.headers!r:.120}"
            f" priority={self.priority!r} properties={self.properties!r:.200}"
        )


def _safe(body: bytes) -> bytes:
    """``body`` unless it is a control command that would stop or change the worker."""
    try:
        data = kombu_json.loads(body)
    except Exception:
        return body
    if isinstance(data, dict) and (
        data.get("command") in (wc.SHUTDOWN, wc.CANCEL) or data.get("topic") == TOPIC
    ):
        return b"{}"
    return body


@st.composite
def poisons(draw: Any, engine_uuid: str) -> Poison:
    """A message with arbitrary properties, headers and body, for one of the targets."""
    target = draw(st.sampled_from(TARGETS))
    body_kind, body = draw(bodies)
    headers = draw(headers_st)
    if body_kind in ("zlib", "bzip2") or draw(st.integers(0, 19)) == 19:
        headers = dict(headers) if isinstance(headers, dict) else {}
        headers["compression"] = (
            "application/x-gzip"
            if body_kind == "zlib"
            else "application/x-bz2"
            if body_kind == "bzip2"
            else draw(compression_names)
        )
    reply_to = draw(
        weighted((5, correlation_ids), (2, st.just(engine_uuid)), (2, st.just("poison-nowhere")))
    )
    properties = {
        "type": draw(types_for(target)),
        "correlation_id": draw(correlation_ids),
        "reply_to": reply_to,
        "delivery_mode": draw(delivery_modes),
        "expiration": draw(expirations),
        "user_id": draw(user_ids),
        "app_id": draw(weighted((6, st.none()), (1, texts))),
        "timestamp": draw(weighted((6, st.none()), (1, st.integers()), (1, texts))),
    }
    properties = {k: v for k, v in properties.items() if v is not None}
    content_type = draw(content_types)
    if body_kind == "pickle":
        content_type = "application/x-python-serialize"
    return Poison(
        target,
        body_kind,
        _safe(body),
        content_type,
        draw(content_encodings),
        headers,
        draw(priorities),
        properties,
    )


# --- publishing and reading back --------------------------------------------


def _kombu_connection(broker: Any, **extra_options: Any) -> kombu.Connection:
    return kombu.Connection(
        broker.url,
        transport=transports.resolve(broker.url, None),
        transport_options={**broker.transport_options, **extra_options},
    )


class RawPublisher:
    """Publishes whatever it is given with raw kombu, saying whether it got through.

    On AMQP with publisher confirms: a message the broker refuses (it closes
    the channel) is known refused, and the publisher opens a new channel.
    """

    def __init__(self, broker: Any, exchanges: list[kombu.Exchange]) -> None:
        self._broker = broker
        # Declared on each channel: a virtual transport routes by the type it knows.
        self._exchanges = exchanges
        self._amqp = broker.kind == "amqp"
        self._conn: kombu.Connection | None = None
        self._channel: Any = None

    def _ready_channel(self) -> Any:
        if self._conn is None or not self._conn.connected:
            self.close()
            self._conn = (
                _kombu_connection(self._broker, confirm_publish=True)
                if self._amqp
                else _kombu_connection(self._broker)
            )
            self._conn.ensure_connection(max_retries=3)
            self._channel = None
        if self._channel is None or (self._amqp and not self._channel.is_open):
            self._channel = self._conn.channel()
            for exchange in self._exchanges:
                exchange.declare(channel=self._channel)
        return self._channel

    def publish(self, poison: Poison, exchange: str, routing_key: str) -> str:
        """Publish ``poison``: SENT, REFUSED_BY_CLIENT or REFUSED_BY_BROKER (with the error)."""
        channel = self._ready_channel()
        try:
            message = channel.prepare_message(
                poison.body,
                poison.priority,
                poison.content_type,
                poison.content_encoding,
                poison.headers,
                dict(poison.properties),
            )
            if self._amqp:
                message._serialize_properties()  # raises on what AMQP cannot carry
        except Exception as e:
            return f"{REFUSED_BY_CLIENT}: {type(e).__name__}"
        try:
            if self._amqp:
                channel.basic_publish(
                    message, exchange=exchange, routing_key=routing_key, confirm_timeout=WAIT_S
                )
            else:
                # Virtual transports serialise the envelope here (and raise first).
                channel.basic_publish(message, exchange=exchange, routing_key=routing_key)
        except Exception as e:
            if not self._amqp:
                return f"{REFUSED_BY_CLIENT}: {type(e).__name__}"
            self._channel = None
            return f"{REFUSED_BY_BROKER}: {type(e).__name__}: {e}"
        return SENT

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.release()
        self._conn = self._channel = None


@dataclasses.dataclass
class DeadLetter:
    message_id: Any
    queue: Any
    reason: Any
    dead_letter_queue: str


class DeadLetterReader:
    """Takes everything from the dead-letter queues of an exchange (one connection)."""

    def __init__(self, broker: Any, exchange: str, queues: list[str]) -> None:
        self._conn = _kombu_connection(broker)
        self._exchange = kombu.Exchange(exchange, type="direct", durable=False, auto_delete=False)
        channel = self._conn.channel()
        self._bound = {
            name: dl.declare_queue(channel, self._exchange, name, durable=False) for name in queues
        }
        #: Every dead letter taken so far, by message id (a list: there must be one each).
        self.by_id: dict[Any, list[DeadLetter]] = collections.defaultdict(list)
        self.taken = 0

    def take(self) -> int:
        """Take what is there now; how many."""
        count = 0
        for name, bound in self._bound.items():
            while (message := bound.get(no_ack=True)) is not None:
                headers = message.headers or {}
                props = dl.original_message(headers)["properties"]
                letter = DeadLetter(
                    props.get("message_id"),
                    headers.get(dl.HEADER_QUEUE),
                    headers.get(dl.HEADER_REASON),
                    name,
                )
                self.by_id[letter.message_id].append(letter)
                count += 1
        self.taken += count
        return count

    def has(self, *message_ids: str) -> bool:
        self.take()
        return all(mid in self.by_id for mid in message_ids)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.release()


# --- the worker, its control loop, the event receiver -----------------------------


def _env() -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )


@contextlib.contextmanager
def worker_process(broker: Any, exchange: str, log_path: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ``flowengine worker`` process serving poison_tasks (stopped at the end)."""
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "worker",
        "--exchange",
        exchange,
        "--topic",
        TOPIC,
        "--tasks",
        "tests.worker_based.poison_tasks",
        "--threads",
        "2",
        "--max-body-bytes",
        str(LIMIT),
        "--url",
        broker.url,
    ]
    for key, value in broker.transport_options.items():
        cmd += ["--transport-option", f"{key}={json.dumps(value)}"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
        try:
            yield proc
        finally:
            stop_processes([proc], 20.0)


@contextlib.contextmanager
def worker_thread(broker: Any, exchange: str) -> Iterator[Any]:
    """An in-process worker (the memory transport lives in one process only)."""
    from flowengine.engines.worker_based.worker_side import worker as wk

    worker = wk.Worker(
        exchange,
        TOPIC,
        ["tests.worker_based.poison_tasks"],
        threads_count=2,
        url=broker.url,
        transport_options=dict(broker.transport_options),
        max_body_bytes=LIMIT,
    )
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker.wait(WAIT_S), "worker did not start"
        yield thread
    finally:
        worker.stop()
        thread.join(WAIT_S)


class Events:
    """An event receiver in a thread, recording what reaches its handler."""

    def __init__(self, exchange: str, settings_: BrokerSettings) -> None:
        self.seen: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.receiver = events_receiver.EventReceiver(exchange, self._handle, broker=settings_)
        self.thread = threading.Thread(target=self.receiver.run, daemon=True, name="poison-events")

    def _handle(self, event: dict[str, Any]) -> None:
        with self._cond:
            self.seen.append(event)
            self._cond.notify_all()

    def start(self) -> None:
        self.thread.start()
        assert self.receiver.wait_ready(WAIT_S), "event receiver did not start"

    def wait_for(self, event_type: str, timeout: float = WAIT_S) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: any(e.get("type") == event_type for e in self.seen), timeout
            )

    def stop(self) -> None:
        self.receiver.stop()
        self.thread.join(WAIT_S)


@dataclasses.dataclass
class Rig:
    """Everything one broker's batches share."""

    broker: Any
    exchange: str
    folder: str
    settings: BrokerSettings
    worker_alive: Any
    worker_id: str
    worker_log: Any
    control: control_client.ControlClient
    events: Events
    publisher: RawPublisher
    dead: DeadLetterReader
    stats: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    kinds: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    outcomes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    secondary: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: Every gate a flow used (all released at the end, so no task waits on).
    gates: list[str] = dataclasses.field(default_factory=list)

    @property
    def topic_queue(self) -> str:
        return names.topic_queue_name(self.exchange, TOPIC)

    @property
    def private_queue(self) -> str:
        return names.worker_queue_name(self.exchange, TOPIC, self.worker_id)

    @property
    def control_queue(self) -> str:
        return wc.control_queue_name(self.exchange, self.worker_id)

    def route(self, target: str, engine_uuid: str) -> tuple[str, str, str]:
        """(exchange, routing key, queue) of ``target``."""
        ex = self.exchange
        return {
            TARGET_TOPIC: (ex, TOPIC, self.topic_queue),
            TARGET_PRIVATE: (
                ex,
                names.worker_routing_key(TOPIC, self.worker_id),
                self.private_queue,
            ),
            TARGET_BROADCAST: (ex, lv.broadcast_routing_key(TOPIC), self.private_queue),
            TARGET_CONTROL: (ex, wc.CONTROL_ROUTING_KEY, self.control_queue),
            TARGET_CONTROL_OWN: (ex, wc.worker_control_key(self.worker_id), self.control_queue),
            TARGET_REPLY: (ex, engine_uuid, names.reply_queue_name(ex, engine_uuid)),
            # A routing key as events have (kombu's Redis fanout drops an empty one).
            TARGET_EVENTS: (events_channel.events_exchange_name(ex), "poison.event", ""),
        }[target]

    def drained(self, exchange: str, queue: str) -> None:
        """Wait (bounded) until ``queue`` holds no message ready; fail if it never does."""
        depth = waiting.wait_until(
            lambda: inventory.queue_depth(self.settings, exchange, queue) == 0 or None,
            f"queue {queue} to be drained",
            timeout=WAIT_S,
            poll_s=0.05,
        )
        assert depth, queue

    def ping(self) -> bool:
        answers = self.control.ask(wc.PING, destination=[self.worker_id], timeout_s=WAIT_S)
        return [a.worker_id for a in answers] == [self.worker_id]

    def diagnostics(self) -> str:
        return self.worker_log() if self.worker_log else ""


@pytest.fixture
def rig(broker, unique_name, tmp_path) -> Iterator[Rig]:
    """A worker (a process, but on memory), a control client, an event receiver, readers."""
    settings_ = BrokerSettings(url=broker.url, transport_options=dict(broker.transport_options))
    folder = tmp_path / "gates"
    folder.mkdir()
    log_path = str(tmp_path / "worker.log")
    with contextlib.ExitStack() as stack:
        if broker.kind == "memory":
            thread = stack.enter_context(worker_thread(broker, unique_name))
            alive, read_log = thread.is_alive, None
        else:
            proc = stack.enter_context(worker_process(broker, unique_name, log_path))
            alive = lambda: proc.poll() is None  # noqa: E731

            def read_log() -> str:
                with open(log_path, encoding="utf-8", errors="replace") as fh:
                    return fh.read()

        control = control_client.ControlClient(unique_name, settings_)
        control.start()
        stack.callback(control.stop)

        def pinged() -> list[Any]:
            assert alive(), "the worker exited:\n" + (read_log() if read_log else "")
            return control.ask(wc.PING, timeout_s=1.0, limit=1)

        answer = waiting.wait_until(
            pinged, "the worker answering ping", timeout=WAIT_S, poll_s=0.05
        )[0]
        events = Events(unique_name, settings_)
        events.start()
        stack.callback(events.stop)
        publisher = RawPublisher(
            broker,
            [
                kombu.Exchange(unique_name, type="direct", durable=False, auto_delete=False),
                events_channel.exchange(unique_name),
            ],
        )
        stack.callback(publisher.close)
        topic_dead = dl.dead_letter_queue_name(
            names.topic_queue_name(unique_name, TOPIC), unique_name, private=False
        )
        private_dead = dl.dead_letter_queue_name("", unique_name, private=True)
        dead = DeadLetterReader(broker, unique_name, [topic_dead, private_dead])
        stack.callback(dead.close)
        rig = Rig(
            broker,
            unique_name,
            str(folder),
            settings_,
            alive,
            answer.worker_id,
            read_log,
            control,
            events,
            publisher,
            dead,
        )
        # Released first at the end: no task of a failed batch waits for them.
        stack.callback(lambda: [pt.release(str(folder), gate) for gate in rig.gates])
        yield rig


# --- flows --------------------------------------------------------------------


def _load(rig: Rig, flow: Any, store: dict[str, Any]) -> Any:
    return engines.load(
        flow,
        store=store,
        engine="worker-based",
        exchange=rig.exchange,
        topics=[TOPIC],
        url=rig.broker.url,
        transport_options=dict(rig.broker.transport_options),
        max_body_bytes=LIMIT,
    )


class GatedFlow:
    """A flow of 20 tasks running in a thread: gate 1, 18 adders, gate 2."""

    def __init__(self, rig: Rig, batch: int) -> None:
        self.folder = rig.folder
        self.base = 1000 * (batch + 1)
        self.gates = (f"b{batch}-first", f"b{batch}-last")
        flow = lf.Flow(f"poison-{batch}").add(
            pt.Gate("first", provides="start", inject={"gate": self.gates[0], "base": self.base}),
            uf.Flow("adders").add(
                *[
                    pt.AddTo(f"add{i}", provides=f"v{i}", inject={"n": i})
                    for i in range(1, ADDERS + 1)
                ]
            ),
            pt.Gate("last", provides="end", inject={"gate": self.gates[1], "base": -1}),
        )
        self.engine = _load(rig, flow, {"folder": rig.folder})
        self.uuid = self.engine._task_executor.uuid
        self.amqp = rig.broker.kind == "amqp"
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="poison-engine")

    def _run(self) -> None:
        try:
            self.engine.run()
        except BaseException as e:  # examined by the test
            self.error.append(e)

    def start(self) -> None:
        self.thread.start()
        waiting.wait_until(
            lambda: (
                os.path.exists(pt.started_path(self.folder, self.gates[0]))
                or not self.thread.is_alive()
            ),
            "the flow's first gate to run",
            timeout=WAIT_S,
            poll_s=0.01,
        )
        assert not self.error, self.error

    def release(self, which: int) -> None:
        pt.release(self.folder, self.gates[which])

    def reply_queue_was_lost(self) -> bool:
        """Whether messages to this engine's reply queue may have gone with a broken connection.

        On RabbitMQ the reply queue outlives its consumer's connection, but
        it is read without acknowledgements (QueueSpec): what the broker had
        already sent down the connection as it broke is gone.
        """
        return self.amqp and self.reply_consumer_reconnections() > 0

    def reply_consumer_reconnections(self) -> int:
        return int(self.engine._task_executor._proxy.reconnect_count)

    def reply_consumer_is_consuming(self) -> bool:
        return bool(self.engine._task_executor._proxy.is_running)

    def finish(self) -> dict[str, Any]:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the engine did not finish its flow"
        assert not self.error, self.error
        return {
            name: self.engine.storage.fetch(name)
            for name in ["start", "end", *[f"v{i}" for i in range(1, ADDERS + 1)]]
        }

    def expected(self) -> dict[str, Any]:
        return {
            "start": self.base,
            "end": -1,
            **{f"v{i}": self.base + i for i in range(1, ADDERS + 1)},
        }


def run_normal_flow(rig: Rig) -> None:
    flow = uf.Flow("after").add(
        *[pt.AddTo(f"after{i}", provides=f"a{i}", inject={"n": i}) for i in range(3)]
    )
    engine = _load(rig, flow, {"start": 7})
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(engine.run()), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert done, "a normal flow did not complete after the flood\n" + rig.diagnostics()
    assert [engine.storage.fetch(f"a{i}") for i in range(3)] == [7, 8, 9]


# --- one batch ------------------------------------------------------------------


def _sentinel(target: str, mid: str) -> Poison:
    """A message every consume loop refuses (not JSON), sent last to ``target``'s queue."""
    message_type = {TARGET_CONTROL: wc.CONTROL, TARGET_REPLY: pr.RESPONSE}.get(target, pr.REQUEST)
    return Poison(
        target,
        "sentinel",
        b"sentinel: not json",
        "application/json",
        "utf-8",
        {},
        None,
        {"type": message_type, "message_id": mid},
    )


def _request_props(**extra: Any) -> dict[str, Any]:
    return {"type": pr.REQUEST, "reply_to": "poison-nowhere", "correlation_id": "c0ffee", **extra}


_VALID_REQUEST = _dumps(TEMPLATES[0])

#: Messages always sent first (Hypothesis' explicit examples): what tripped
#: consume loops before, and what a transport's envelope cannot carry back.
EXPLICIT = (
    # kombu's JSON refuses to read these back out of a virtual transport's envelope.
    Poison(
        TARGET_TOPIC,
        "tagged header",
        _VALID_REQUEST,
        "application/json",
        "utf-8",
        {"expires": {"__type__": "no-such-type", "__value__": 1}},
        None,
        _request_props(),
    ),
    Poison(
        TARGET_PRIVATE,
        "tagged header",
        _VALID_REQUEST,
        "application/json",
        "utf-8",
        {"attempt": {"__type__": "datetime", "__value__": "not a date"}},
        None,
        _request_props(),
    ),
    Poison(
        TARGET_REPLY,
        "tagged property",
        _dumps(TEMPLATES[2]),
        "application/json",
        "utf-8",
        {},
        None,
        {"type": pr.RESPONSE, "correlation_id": {"__type__": "uuid", "__value__": "zz"}},
    ),
    Poison(
        TARGET_CONTROL,
        "tagged property",
        _dumps(TEMPLATES[9]),
        "application/json",
        "utf-8",
        {},
        None,
        {"type": wc.CONTROL, "reply_to": {"__type__": "decimal", "__value__": "x"}},
    ),
    # A compressed, otherwise valid request (issue 35's first report) and a lying one.
    Poison(
        TARGET_TOPIC,
        "zlib",
        zlib.compress(_VALID_REQUEST),
        "application/json",
        "utf-8",
        {"compression": "application/x-gzip"},
        None,
        _request_props(),
    ),
    Poison(
        TARGET_TOPIC,
        "near-valid json",
        _VALID_REQUEST,
        "application/json",
        "utf-8",
        {"compression": "application/x-gzip"},
        None,
        _request_props(),
    ),
    # Headers that are not a mapping (AMQP cannot carry them).
    Poison(
        TARGET_PRIVATE,
        "near-valid json",
        _VALID_REQUEST,
        "application/json",
        "utf-8",
        ["not", "a", "mapping"],
        None,
        _request_props(),
    ),
    Poison(
        TARGET_REPLY,
        "near-valid json",
        _dumps(TEMPLATES[2]),
        "application/json",
        "utf-8",
        "headers",
        None,
        {"type": pr.RESPONSE, "correlation_id": "c0ffee"},
    ),
    # A pickle, which must never be unpickled.
    Poison(
        TARGET_CONTROL_OWN,
        "pickle",
        pickle.dumps({"command": "ping"}),
        "application/x-python-serialize",
        "binary",
        {},
        None,
        {"type": wc.CONTROL},
    ),
    # Properties of wrong types and out of range.
    Poison(
        TARGET_TOPIC,
        "near-valid json",
        _VALID_REQUEST,
        "application/json",
        "utf-8",
        {},
        10**6,
        _request_props(correlation_id=7, delivery_mode="often"),
    ),
    Poison(
        TARGET_BROADCAST,
        "near-valid json",
        b"{}",
        "application/json",
        "utf-8",
        {},
        "high",
        {"type": pr.NOTIFY, "reply_to": ["a", "list"]},
    ),
    # Short strings that are not UTF-8 (AMQP carries any octets).
    Poison(
        TARGET_TOPIC,
        "near-valid json",
        _VALID_REQUEST,
        "application/json",
        "utf-8",
        {},
        None,
        _request_props(reply_to=b"\xe3&\xfe"),
    ),
    Poison(
        TARGET_REPLY,
        "near-valid json",
        _dumps(TEMPLATES[2]),
        b"application/\xff",
        "utf-8",
        {},
        None,
        {"type": b"\xffRESPONSE", "correlation_id": b"\xc3\x28"},
    ),
    Poison(
        TARGET_CONTROL,
        "near-valid json",
        _dumps(TEMPLATES[9]),
        "application/json",
        b"\xfe",
        {b"\xff": b"\xfe"},
        None,
        {"type": wc.CONTROL},
    ),
)

#: The reply_to a generated message carries for "the engine's reply queue"
#: (the engine's uuid is known once its batch's flow runs).
ENGINE_PLACEHOLDER = "engine-uuid-placeholder"


class Batch:
    """A flood of PER_BATCH messages while an engine runs a flow, then the checks."""

    def __init__(self, rig: Rig, number: int) -> None:
        self.rig = rig
        self.number = number
        self.flow = GatedFlow(rig, number)
        rig.gates.extend(self.flow.gates)
        self.flow.start()
        self.count = 0
        #: id -> (message, the queue it went to, why it must be refused or None).
        self.sent: dict[str, tuple[Poison, str, str | None]] = {}

    def publish(self, poison: Poison) -> None:
        rig = self.rig
        if self.count == PER_BATCH // 2:
            self.flow.release(0)  # the adders' 18 requests now mix with the flood
        mid = f"p{self.number}-{self.count}"
        self.count += 1
        properties = dict(poison.properties, message_id=mid)
        if properties.get("reply_to") == ENGINE_PLACEHOLDER:
            properties["reply_to"] = self.flow.uuid
        poison = dataclasses.replace(poison, properties=properties)
        exchange, routing_key, queue = rig.route(poison.target, self.flow.uuid)
        if poison.routing_key is not None:
            routing_key = poison.routing_key
        outcome = rig.publisher.publish(poison, exchange, routing_key)
        rig.stats["generated"] += 1
        rig.stats[f"target {poison.target}"] += 1
        if outcome != SENT:
            rig.outcomes[outcome.split(":")[0]] += 1
            rig.kinds[outcome] += 1
            return
        rig.outcomes[SENT] += 1
        reason = must_refuse(poison, rig.broker.kind)
        rig.kinds[poison.target if poison.target == TARGET_EVENTS else reason or "maybe valid"] += 1
        self.sent[mid] = (poison, queue, reason)

    def check(self) -> None:
        """Everything alive, every queue drained, the dead letters right, the flows done."""
        rig, flow, sent = self.rig, self.flow, self.sent
        if self.count <= PER_BATCH // 2:
            flow.release(0)
        # One message every loop refuses, last into each queue: once it is
        # dead-lettered, everything before it in that queue was handled.
        sentinels = {}
        for target in (TARGET_TOPIC, TARGET_PRIVATE, TARGET_CONTROL, TARGET_REPLY):
            mid = f"sentinel-{self.number}-{target}"
            exchange, routing_key, queue = rig.route(target, flow.uuid)
            assert rig.publisher.publish(_sentinel(target, mid), exchange, routing_key) == SENT
            sentinels[mid] = queue
        events_exchange = events_channel.events_exchange_name(rig.exchange)
        sentinel_event = f"poison.sentinel.{self.number}"
        event = Poison(
            TARGET_EVENTS,
            "sentinel",
            _dumps({"type": sentinel_event}),
            "application/json",
            "utf-8",
            {},
            None,
            {"type": "event"},
        )
        assert rig.publisher.publish(event, events_exchange, sentinel_event) == SENT
        certain = [mid for mid, (_p, _q, reason) in sent.items() if reason is not None]
        # On RabbitMQ the engine's reply queue is read without
        # acknowledgements: when its consumer's connection broke during the
        # batch (a missed heartbeat on a loaded machine), what the broker had
        # sent down that connection never reached flowengine. Those messages
        # cannot be asked for.
        reply_mids = [mid for mid in certain if sent[mid][0].target == TARGET_REPLY]
        reply_sentinel = f"sentinel-{self.number}-{TARGET_REPLY}"
        others = [m for m in (*sentinels, *certain) if m not in reply_mids and m != reply_sentinel]

        def all_arrived() -> bool:
            if rig.dead.has(*sentinels, *certain):
                return True
            return flow.reply_queue_was_lost() and rig.dead.has(*others)

        if not waiting.holds_within(all_arrived, timeout=WAIT_S, poll_s=0.02):
            missing = [
                sent[mid][0].summary() + f" [{sent[mid][2]}]"
                for mid in certain
                if mid not in rig.dead.by_id
            ]
            raise AssertionError(
                f"not dead-lettered ({len(missing)}), e.g.:\n"
                + "\n".join(missing[:10])
                + f"\nsentinels: {[s in rig.dead.by_id for s in sentinels]}\n"
                + f"reply consumer consuming {flow.reply_consumer_is_consuming()},"
                f" reconnections {flow.reply_consumer_reconnections()}\n"
                + waiting.thread_stacks()
                + rig.diagnostics()[-5000:]
            )
        lost_with_the_reply_queue: set[str] = set()
        if not rig.dead.has(*sentinels, *certain):
            # Reply messages were lost: a second sentinel, sent once the
            # consumer is back, vouches that the queue is read again.
            waiting.wait_until(flow.reply_consumer_is_consuming, "the reply consumer", WAIT_S)
            again = f"{reply_sentinel}-again"
            exchange, routing_key, queue = rig.route(TARGET_REPLY, flow.uuid)
            assert (
                rig.publisher.publish(_sentinel(TARGET_REPLY, again), exchange, routing_key) == SENT
            )
            assert waiting.holds_within(lambda: rig.dead.has(again), timeout=WAIT_S), (
                "the reply consumer does not read its queue after reconnecting"
            )
            rig.dead.by_id.pop(reply_sentinel, None)  # if it was not lost too
            del sentinels[reply_sentinel]
            sentinels[again] = queue
            lost_with_the_reply_queue = {m for m in reply_mids if m not in rig.dead.by_id}
            rig.stats["lost in flight to a reply consumer that reconnected"] += len(
                lost_with_the_reply_queue
            )
        rig.dead.take()
        assert rig.events.wait_for(sentinel_event), "the event receiver stopped reading"

        # Every process is alive and its loops work,
        assert rig.worker_alive(), "the worker died\n" + rig.diagnostics()
        assert flow.thread.is_alive(), f"the engine stopped during the flood: {flow.error}"
        assert rig.events.thread.is_alive(), "the event receiver died"
        assert rig.ping(), "the worker's control loop does not answer\n" + rig.diagnostics()
        # every queue is drained (the topic queue once the flow, whose
        # requests go there too, is done),
        rig.drained(rig.exchange, names.reply_queue_name(rig.exchange, flow.uuid))
        rig.drained(rig.exchange, rig.private_queue)
        rig.drained(rig.exchange, rig.control_queue)
        rig.drained(events_exchange, rig.events.receiver._queue_name)
        # each message that must be refused sits in the right dead-letter
        # queue, once, and nothing of ours is there twice,
        for mid, (poison, queue, reason) in sent.items():
            letters = rig.dead.by_id.get(mid, [])
            assert len(letters) <= 1, (poison.summary(), letters)
            if reason is not None and mid not in lost_with_the_reply_queue:
                assert letters and letters[0].queue == queue, (poison.summary(), reason, letters)
            if letters:
                rig.stats["dead-lettered"] += 1
                rig.stats[f"dead-lettered from {poison.target}"] += 1
                if reason is None:
                    rig.stats["dead-lettered, valid by the oracle"] += 1
        for mid in sentinels:
            assert len(rig.dead.by_id.pop(mid)) == 1, mid
        for mid in list(rig.dead.by_id):
            if mid not in sent:
                # A message a worker sent because of one of ours (a FAILURE
                # answer to a reply_to that reaches the engine, say).
                for letter in rig.dead.by_id.pop(mid):
                    rig.secondary[f"{letter.queue}: {str(letter.reason)[:80]}"] += 1
                    rig.stats["secondary dead letters"] += 1
            else:
                del rig.dead.by_id[mid]
        # and the engine that ran a flow during the flood finishes it, every
        # result right,
        flow.release(1)
        assert flow.finish() == flow.expected()
        rig.stats["engine reply consumer reconnections"] += flow.reply_consumer_reconnections()
        rig.stats["gated flows completed"] += 1
        rig.drained(rig.exchange, rig.topic_queue)
        # then a normal flow completes on the same worker.
        run_normal_flow(rig)
        rig.stats["normal flows completed"] += 1
        assert rig.worker_alive(), "the worker died\n" + rig.diagnostics()
        rig.stats["batches"] += 1


def write_summary(rig: Rig, seconds: float) -> str:
    events = rig.events.receiver
    stats = rig.stats
    line = (
        f"[poison/{rig.broker.kind}] {stats['generated']} generated in"
        f" {stats['batches']} batches, {seconds:.1f} s;"
        f" publish outcomes {dict(rig.outcomes)};"
        f" dead-lettered {rig.stats['dead-lettered']}"
        f" (of which valid by the oracle {rig.stats['dead-lettered, valid by the oracle']});"
        f" secondary dead letters {rig.stats['secondary dead letters']};"
        f" the engines' reply consumers reconnected"
        f" {rig.stats['engine reply consumer reconnections']} time(s), losing"
        f" {rig.stats['lost in flight to a reply consumer that reconnected']} message(s)"
        " in flight;"
        f" event receiver: {events.unreadable_count} unreadable dropped,"
        f" {len(rig.events.seen)} events handled; worker alive {rig.worker_alive()},"
        f" gated flows {rig.stats['gated flows completed']},"
        f" normal flows {rig.stats['normal flows completed']}"
    )
    detail = "\n".join(
        [
            line,
            "kinds (oracle's reason, for what was sent): "
            + json.dumps(dict(rig.kinds.most_common()), sort_keys=False),
            "targets: "
            + json.dumps({k: v for k, v in sorted(rig.stats.items()) if k.startswith("target ")}),
            "dead-lettered per target: "
            + json.dumps(
                {k: v for k, v in sorted(rig.stats.items()) if k.startswith("dead-lettered from")}
            ),
            "secondary dead letters: " + json.dumps(dict(rig.secondary)),
        ]
    )
    with open(f"/tmp/poison_summary_{rig.broker.kind}.txt", "w", encoding="utf-8") as fh:
        fh.write(detail + "\n")
    return detail


#: Log lines no process may write while refusing poison: a handler that
#: crashed, a loop that failed, a message dropped instead of dead-lettered.
BAD_LOG_LINES = ("Traceback", "ERROR", "CRITICAL")


@pytest.mark.slow
def test_the_oracle_judges_amqp_messages_by_the_properties_the_wire_carries():
    # py-amqp writes correlation_id=0 as '' (a string): a valid NOTIFY on the
    # wire, where the same message on Redis keeps an int the worker refuses.
    poison = Poison(
        TARGET_TOPIC,
        "json",
        b"{}",
        "application/json",
        "utf-8",
        None,
        None,
        {"type": pr.NOTIFY, "correlation_id": 0, "reply_to": "engine"},
    )
    assert must_refuse(poison, "redis") == "mistyped property"
    assert must_refuse(poison, "amqp") is None


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_generated_poison_messages_are_dead_lettered_and_everything_goes_on(rig, caplog):
    # Each Hypothesis example is one message (small examples: Hypothesis
    # explores each field); every PER_BATCH of them form a batch, flooded
    # while an engine runs a flow, and checked when it is complete.
    caplog.set_level(logging.WARNING)
    # Which messages each consume loop dead-lettered, in order, on failure.
    caplog.set_level(logging.INFO, logger=consumer_mod.__name__)
    started = time.monotonic()
    current: list[Batch] = []
    failed: list[BaseException] = []

    @settings(
        max_examples=BATCHES * PER_BATCH,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(poisons(ENGINE_PLACEHOLDER))
    def each_message(poison: Poison) -> None:
        if failed:
            return  # the rig is broken: the rest of the examples are not run
        try:
            if not current:
                current.append(Batch(rig, int(rig.stats["batches"])))
            batch = current[0]
            batch.publish(poison)
            if batch.count == PER_BATCH:
                current.clear()
                batch.check()
        except BaseException as e:
            # Raised below, not to Hypothesis: a batch's failure is not the
            # example's at hand (the messages at fault are named in it), and
            # Hypothesis would run that example again on a broken rig.
            failed.append(e)

    for poison in reversed(EXPLICIT):
        each_message = example(poison)(each_message)
    try:
        each_message()
        if current and not failed:  # Hypothesis ran fewer examples than asked (it may)
            current.pop().check()
    finally:
        print("\n" + write_summary(rig, time.monotonic() - started))
    if failed:
        raise failed[0]
    assert rig.stats["batches"] >= BATCHES
    # Nothing was logged as an error: here (the engine, the receiver; the
    # worker too on memory) nor by the worker process.
    errors = [r.getMessage()[:300] for r in caplog.records if r.levelno >= logging.ERROR]
    # Except that a reply consumer whose connection was reset (load, not
    # poison: see Batch.check) said so, once per reconnection. A broker that
    # closed the connection over a frame it refused says why (a reply code),
    # not a reset: that stays an error here.
    reconnections = int(rig.stats["engine reply consumer reconnections"])
    lost_lines = [
        e
        for e in errors
        if e.startswith("Consumer connection of")
        and any(reset in e for reset in ("[Errno 104]", "Connection reset by peer"))
    ]
    if 0 < len(lost_lines) <= reconnections:
        errors = [e for e in errors if e not in lost_lines]
    assert not errors, errors
    worker_log = rig.diagnostics()
    bad = [
        line[:300]
        for line in worker_log.splitlines()
        if any(word in line for word in BAD_LOG_LINES)
    ]
    assert not bad, bad


@pytest.mark.broker
def test_an_event_whose_routing_key_is_not_utf8_does_not_stop_the_receiver(
    amqp_url, unique_name, caplog
):
    # py-amqp raises UnicodeDecodeError decoding the Basic.Deliver of a message
    # whose routing key is not UTF-8 (amqp/serialization.py, 's' fields), before
    # any consumer sees it, and the connection is gone. Only a fanout (or
    # wildcard) binding lets such a key reach a queue: the events exchange.
    broker = types.SimpleNamespace(kind="amqp", url=amqp_url, transport_options={})
    events = Events(unique_name, BrokerSettings(url=amqp_url))
    events.start()
    publisher = RawPublisher(broker, [events_channel.exchange(unique_name)])
    try:
        exchange = events_channel.events_exchange_name(unique_name)
        poison = Poison(
            TARGET_EVENTS,
            "json",
            _dumps({"type": "poison"}),
            "application/json",
            "utf-8",
            {},
            None,
            {"type": "event"},
        )
        with caplog.at_level(logging.WARNING, logger="flowengine"):
            assert publisher.publish(poison, exchange, b"\xff.\xfe") == SENT
            # Then the receiver says why its stream broke, and consumes again:
            # an event published after it reaches the handler (events are
            # fire-and-forget: one sent while it reconnects is lost, so send
            # until one arrives, within a bound)
            waiting.wait_until(
                lambda: any(
                    "Event stream of" in r.getMessage() and "can't decode" in r.getMessage()
                    for r in caplog.records
                ),
                "the receiver to report the broken stream",
                WAIT_S,
            )
        deadline = time.monotonic() + WAIT_S
        seen = False
        while not seen and time.monotonic() < deadline:
            after = Poison(
                TARGET_EVENTS,
                "json",
                _dumps({"type": "after"}),
                "application/json",
                "utf-8",
                {},
                None,
                {"type": "event"},
            )
            assert publisher.publish(after, exchange, "after") == SENT
            seen = events.wait_for("after", timeout=0.5)
        assert seen, "the event receiver stopped reading"
        assert events.thread.is_alive(), "the event receiver died"
        assert not any(e.get("type") == "poison" for e in events.seen)
    finally:
        publisher.close()
        events.stop()
