"""TypeDispatcher: routing by type, required properties, validation, rejection.

The dispatcher refuses what is invalid and leaves every other message for the
consumer to acknowledge (see messaging/delivery.py); settling twice is a bug
the Delivery refuses.
"""

from __future__ import annotations

import logging

import pytest

from flowengine import exceptions as exc
from flowengine.engines.worker_based.messaging import dispatcher as d
from flowengine.engines.worker_based.messaging.delivery import Delivery


class KombuMessage:
    """Just enough of kombu.Message: properties, headers, body, ack/reject/requeue."""

    def __init__(self, body, properties):
        self.properties = properties
        self.headers = {}
        self.body = body
        self.delivery_tag = 1
        self.calls = []

    def ack(self):
        self.calls.append("ack")

    def reject(self, requeue=False):
        self.calls.append("reject")

    def requeue(self):
        self.calls.append("requeue")


def FakeMessage(body=b"{}", **properties):  # noqa: N802 - reads like the class it stands for
    """A Delivery of a fake kombu message with these properties."""
    return Delivery(KombuMessage(body, properties))


def _dispatcher(handler, **kwargs):
    rejected = []
    disp = d.TypeDispatcher(
        {"REQUEST": handler}, on_reject=lambda m, reason: rejected.append(reason), **kwargs
    )
    return disp, rejected


def test_handler_properties():
    proc, val = (lambda data, msg: None), (lambda data: None)
    handler = d.Handler(proc, validator=val, required_properties=("reply_to",))
    assert handler.process_message is proc and handler.validator is val
    assert handler.required_properties == ("reply_to",)
    assert d.Handler(proc).validator is None


def test_valid_message_is_processed_and_left_for_the_consumer_to_settle():
    seen = []
    disp, rejected = _dispatcher(d.Handler(lambda data, msg: seen.append((data, msg.outcome))))
    msg = FakeMessage(type="REQUEST")
    disp.on_message({"a": 1}, msg)
    assert seen == [({"a": 1}, None)] and not rejected
    assert msg.outcome is None and msg.message.calls == []


@pytest.mark.parametrize(
    "props,needle",
    [
        ({}, "no 'type' property"),
        ({"type": "BOGUS"}, "unexpected message type 'BOGUS'"),
    ],
)
def test_missing_or_unknown_type_is_rejected(props, needle, caplog):
    disp, rejected = _dispatcher(d.Handler(lambda data, msg: pytest.fail("processed")))
    msg = FakeMessage(**props)
    with caplog.at_level(logging.WARNING):
        disp.on_message({}, msg)
    assert msg.refusal and msg.outcome is None and msg.message.calls == []
    assert needle in rejected[0]
    assert needle in caplog.text and disp.rejected_count == 1


def test_missing_required_properties_are_named():
    disp, rejected = _dispatcher(
        d.Handler(
            lambda data, msg: pytest.fail("processed"),
            required_properties=("reply_to", "correlation_id"),
        )
    )
    msg = FakeMessage(type="REQUEST", reply_to="r")
    disp.on_message({}, msg)
    assert msg.refusal and msg.outcome is None
    assert "lacks required property correlation_id" in rejected[0]


def test_invalid_body_is_rejected_with_the_validators_reason(caplog):
    def validator(data):
        raise exc.InvalidFormat("'task_cls' is a required property")

    disp, rejected = _dispatcher(
        d.Handler(lambda data, msg: pytest.fail("processed"), validator=validator)
    )
    msg = FakeMessage(type="REQUEST")
    with caplog.at_level(logging.WARNING):
        disp.on_message({}, msg)
    assert rejected == ["'task_cls' is a required property"]
    assert "'task_cls' is a required property" in caplog.text
    assert msg.refusal and msg.outcome is None  # dead-lettered by its consumer


def test_crashing_validator_is_a_rejection_not_a_crash():
    def validator(data):
        raise KeyError("boom")

    disp, rejected = _dispatcher(d.Handler(lambda data, msg: None, validator=validator))
    disp.on_message({}, FakeMessage(type="REQUEST"))
    assert "validation error" in rejected[0]


def test_handler_exception_is_logged_not_raised(caplog):
    def handler(data, msg):
        raise RuntimeError("handler broke")

    disp, rejected = _dispatcher(d.Handler(handler))
    with caplog.at_level(logging.ERROR):
        disp.on_message({}, FakeMessage(type="REQUEST"))
    assert "handler broke" in caplog.text and not rejected


def test_requeue_filters_vote():
    seen = []
    votes = [lambda data, msg: data.get("later", False)]
    disp = d.TypeDispatcher(
        {"REQUEST": d.Handler(lambda data, msg: seen.append(data))}, requeue_filters=votes
    )
    later, now = FakeMessage(type="REQUEST"), FakeMessage(type="REQUEST")
    disp.on_message({"later": True}, later)
    disp.on_message({"later": False}, now)
    assert later.outcome == "requeued" and later.message.calls == ["requeue"]
    assert now.outcome is None and seen == [{"later": False}]
    assert disp.requeue_filters == votes


def test_failing_requeue_filter_counts_as_no():
    def broken(data, msg):
        raise ValueError("nope")

    seen = []
    disp = d.TypeDispatcher(
        {"REQUEST": d.Handler(lambda data, msg: seen.append(1))}, requeue_filters=[broken]
    )
    disp.on_message({}, FakeMessage(type="REQUEST"))
    assert seen == [1]


def test_decode_error_is_a_rejection_with_an_excerpt():
    disp, rejected = _dispatcher(d.Handler(lambda data, msg: None))
    msg = FakeMessage(body=b"{not json", type="REQUEST")
    disp.on_decode_error(msg, ValueError("Expecting property name"))
    assert msg.refusal and msg.outcome is None
    assert "undecodable body" in rejected[0] and "{not json" in rejected[0]


def test_failing_on_reject_callback_is_contained(caplog):
    def on_reject(message, reason):
        raise RuntimeError("callback broke")

    disp = d.TypeDispatcher({}, on_reject=on_reject)
    msg = FakeMessage(type="X")
    disp.on_message({}, msg)
    assert msg.refusal and "callback broke" in caplog.text


def test_type_handlers_property():
    handler = d.Handler(lambda data, msg: None)
    assert d.TypeDispatcher({"A": handler}).type_handlers == {"A": handler}
    assert d.TypeDispatcher().type_handlers == {}


def test_a_delivery_is_settled_once():
    msg = FakeMessage(type="REQUEST")
    msg.ack()
    with pytest.raises(RuntimeError, match="already acked"):
        msg.reject()
    assert msg.message.calls == ["ack"]


def test_a_failed_ack_leaves_it_unsettled():
    class Broken(KombuMessage):
        def ack(self):
            raise ConnectionError("broker gone")

    msg = Delivery(Broken(b"{}", {"type": "REQUEST"}))
    with pytest.raises(exc.DeliveryNotSettled, match="broker gone"):
        msg.ack()
    assert not msg.settled
