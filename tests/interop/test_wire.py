"""The wire format, checked against TaskFlow's own code (not against a copy of it).

Bodies each side builds must pass the other side's validators and decode to
the same thing; a message each side publishes must arrive byte-identical
(body, properties, routing); and the declarations must agree under
``compat='taskflow'`` (and are known to clash without it).
"""

from __future__ import annotations

import json
import uuid

import kombu
import pytest
from kombu.transport.virtual.base import NotEquivalentError

from flowengine.engines.worker_based import protocol as fe_pr
from flowengine.engines.worker_based.messaging import compat
from flowengine.engines.worker_based.messaging import proxy as fe_proxy
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import topology
from flowengine.types import failure as fe_ft
from tests.interop import shared_tasks as st

tf_pr = pytest.importorskip("taskflow.engines.worker_based.protocol")
from taskflow.engines.worker_based import proxy as tf_proxy  # noqa: E402
from taskflow.types import failure as tf_ft  # noqa: E402

FE = st.build("flowengine")
TF = st.build("taskflow")


def _capture(failure_cls):
    """A failure of ``failure_cls`` for one RuntimeError (same traceback text either way)."""
    try:
        raise RuntimeError(st.BOOM_MESSAGE)
    except RuntimeError:
        return failure_cls()


def _fe_failure() -> fe_ft.Failure:
    return _capture(fe_ft.Failure)


def _tf_failure() -> tf_ft.Failure:
    return _capture(tf_ft.Failure)


def _on_the_wire(body):
    """``body`` as the receiver decodes it (tuples become lists)."""
    return json.loads(json.dumps(body))


def _requests(pr, tasks, failure):
    """An execute and a revert request (with a failure result and flow failures)."""
    task = tasks.Remember(name="first")
    return [
        pr.Request(task, "u-1", "execute", {"marker_dir": "/tmp"}),
        pr.Request(
            task,
            "u-1",
            "revert",
            {"marker_dir": "/tmp"},
            result=failure,
            failures={"boom": failure},
        ),
        pr.Request(
            task,
            "u-2",
            "revert",
            {"marker_dir": "/tmp"},
            result="first ran",
            failures={"boom": failure},
        ),
    ]


def _responses(pr, failure):
    return [
        pr.Response("RUNNING"),
        pr.Response("EVENT", event_type="update_progress", details={"progress": 0.5}),
        pr.Response("SUCCESS", result=[1, {"a": None}]),
        pr.Response("FAILURE", result=pr.failure_to_dict(failure)),
    ]


def test_flowengine_bodies_pass_taskflow_validation():
    for request in _requests(fe_pr, FE, _fe_failure()):
        body = _on_the_wire(request.to_dict())
        tf_pr.Request.validate(body)
        work = tf_pr.Request.from_dict(body, task_uuid="u")
        assert work.task_cls == f"{st.__name__}.Remember"
        if "result" in body and body["result"][0] == "failure":
            assert work.arguments["result"].check(RuntimeError)
    for response in _responses(fe_pr, _fe_failure()):
        tf_pr.Response.validate(_on_the_wire(response.to_dict()))
        tf_pr.Response.from_dict(_on_the_wire(response.to_dict()))
    tf_pr.Notify.validate(fe_pr.Notify().to_dict(), response=False)
    tf_pr.Notify.validate(fe_pr.Notify(topic="t", tasks=["a.B"]).to_dict(), response=True)
    tf_ft.Failure.validate(_on_the_wire(fe_pr.failure_to_dict(_fe_failure())))


def test_taskflow_bodies_pass_flowengine_validation():
    for request in _requests(tf_pr, TF, _tf_failure()):
        body = _on_the_wire(request.to_dict())
        fe_pr.Request.validate(body)
        work = fe_pr.Request.from_dict(body, task_uuid="u")
        assert work.task_cls == f"{st.__name__}.Remember"
        if "result" in body and body["result"][0] == "failure":
            assert work.arguments["result"].check(RuntimeError)
    for response in _responses(tf_pr, _tf_failure()):
        body = _on_the_wire(response.to_dict())
        fe_pr.Response.validate(body)
        decoded = fe_pr.Response.from_dict(body)
        if decoded.state == "FAILURE":
            assert decoded.data["result"].check(RuntimeError)
            assert decoded.data["result"].exception_str == st.BOOM_MESSAGE
    fe_pr.Notify.validate(tf_pr.Notify().to_dict(), response=False)
    fe_pr.Notify.validate(tf_pr.Notify(topic="t", tasks=["a.B"]).to_dict(), response=True)
    fe_ft.Failure.validate(_on_the_wire(tf_pr.failure_to_dict(_tf_failure())))


def _drain(conn, queue):
    """Every message waiting in ``queue`` (bounded), as delivered."""
    got = []
    with conn.SimpleQueue(queue) as q:
        while True:
            try:
                message = q.get(timeout=0.2)
            except q.Empty:
                return got
            message.ack()
            got.append(message)


#: Properties a kombu virtual transport adds to store a message, not part of it:
#: its per-message tag, and how it stored the body (base64 on kombu's memory
#: transport, none on flowengine's); the body itself is compared decoded.
_STORAGE_PROPERTIES = ("delivery_tag", "body_encoding")


def _props(message):
    return {k: v for k, v in message.properties.items() if k not in _STORAGE_PROPERTIES}


@pytest.mark.parametrize("kind", ["request", "revert", "response", "notify"])
def test_published_messages_are_byte_identical(kind):
    # Given a TaskFlow proxy and a flowengine proxy (compat='taskflow') on one exchange
    exchange, key = f"wire-{uuid.uuid4().hex[:8]}", "topic"
    tf = tf_proxy.Proxy(key, exchange, transport="memory")
    fe = fe_proxy.Proxy(key, exchange, broker=BrokerSettings(transport="memory", compat="taskflow"))
    with kombu.Connection(transport="memory") as conn:
        queue = kombu.Queue(
            f"{exchange}_{key}",
            exchange=compat.make_exchange(exchange, compat="taskflow"),
            routing_key=key,
            durable=False,
            auto_delete=True,
        )
        queue(conn.default_channel).declare()
        # When each publishes the same message with the same properties
        messages = {
            "request": (
                _requests(tf_pr, TF, _tf_failure())[0],
                _requests(fe_pr, FE, _fe_failure())[0],
            ),
            "revert": (
                _requests(tf_pr, TF, _tf_failure())[2],
                _requests(fe_pr, FE, _fe_failure())[2],
            ),
            "response": (
                tf_pr.Response("SUCCESS", result={"z": [1, 2]}),
                fe_pr.Response("SUCCESS", result={"z": [1, 2]}),
            ),
            "notify": (
                tf_pr.Notify(topic="t", tasks=["a.B"]),
                fe_pr.Notify(topic="t", tasks=["a.B"]),
            ),
        }[kind]
        for proxy, msg in zip((tf, fe), messages):
            proxy.publish(msg, key, reply_to="executor-uuid", correlation_id="req-uuid")
        tf_msg, fe_msg = _drain(conn, queue)
    # Then body bytes, properties and routing are the same
    assert fe_msg.body == tf_msg.body
    for prop in ("type", "reply_to", "correlation_id"):
        assert fe_msg.properties.get(prop) == tf_msg.properties.get(prop), prop
    # ... and every other property too (delivery mode, priority, ...), but
    # the transport's storage bookkeeping (see _STORAGE_PROPERTIES).
    assert _props(fe_msg) == _props(tf_msg)
    assert fe_msg.content_type == tf_msg.content_type == "application/json"
    assert fe_msg.content_encoding == tf_msg.content_encoding == "utf-8"
    assert fe_msg.delivery_info["routing_key"] == tf_msg.delivery_info["routing_key"] == key
    assert fe_msg.delivery_info["exchange"] == tf_msg.delivery_info["exchange"] == exchange


def test_declarations_match_taskflow_only_in_compat_mode():
    exchange, key = f"wire-{uuid.uuid4().hex[:8]}", "topic"
    tf = tf_proxy.Proxy(key, exchange, transport="memory")
    tf_exchange = tf._exchange
    tf_queue = tf._make_queue(key, tf_exchange)
    ours = compat.make_exchange(exchange, compat="taskflow")
    assert (ours.type, ours.durable, ours.auto_delete) == (
        tf_exchange.type,
        tf_exchange.durable,
        tf_exchange.auto_delete,
    )
    assert tf_queue.name == fe_pr.topic_queue_name(exchange, key)
    assert (tf_queue.durable, tf_queue.auto_delete) == (
        False,
        compat.topic_queue_auto_delete("taskflow"),
    )
    # A TaskFlow worker's reply declares the engine's reply queue as TaskFlow
    # does; in compat mode ours is declared the same (on RabbitMQ too), and
    # without it ours outlives its consumer's connection (x-expires).
    tf_reply_queue = tf._make_queue("executor-uuid", tf_exchange)
    for mode, same in (("taskflow", True), (None, False)):
        reply_queue = topology.make_queue(
            fe_pr.reply_queue_name(exchange, "executor-uuid"),
            ours,
            ("executor-uuid",),
            auto_delete=True,
            outlives_connection=compat.reply_queue_outlives_connection(mode),
        )
        assert reply_queue.name == tf_reply_queue.name
        declared = (reply_queue.durable, reply_queue.auto_delete, reply_queue.queue_arguments)
        expected = (tf_reply_queue.durable, tf_reply_queue.auto_delete, None)
        assert (declared == expected) is same, (mode, declared, expected)
    # Without compat flowengine's exchange outlives its queues: a broker (here
    # kombu's memory transport, like RabbitMQ) refuses the second declaration.
    default = compat.make_exchange(exchange)
    assert default.auto_delete != tf_exchange.auto_delete
    with kombu.Connection(transport="memory") as conn:
        tf_exchange(conn.default_channel).declare()
        ours(conn.default_channel).declare()
        with pytest.raises(NotEquivalentError):
            default(conn.default_channel).declare()


def test_compat_refuses_settings_taskflow_cannot_follow():
    assert compat.check(None) is None
    assert compat.check("TaskFlow") == "taskflow"
    with pytest.raises(ValueError, match="Unknown compat"):
        compat.check("celery")
    with pytest.raises(ValueError, match="durable"):
        BrokerSettings(transport="memory", durable=True, compat="taskflow")
    with pytest.raises(ValueError, match="signing"):
        BrokerSettings(transport="memory", secret="k" * 32, compat="taskflow")


def test_peer_detection_by_missing_headers():
    assert compat.is_taskflow_peer({}, "worker")
    assert compat.is_taskflow_peer(None, "engine")
    assert not compat.is_taskflow_peer({fe_pr.HEADER_WORKER_ID: "w"}, "worker")
    assert not compat.is_taskflow_peer(
        {fe_pr.HEADER_ORIGIN: "h:1", fe_pr.HEADER_ATTEMPT: 0}, "engine"
    )
