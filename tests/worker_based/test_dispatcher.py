"""TypeDispatcher: routing by type, required properties, validation, rejection."""

from __future__ import annotations

import logging

import pytest

from flowengine import exceptions as exc
from flowengine.engines.worker_based.messaging import dispatcher as d


class FakeMessage:
    """Just enough of kombu.Message: properties, headers, body, ack/reject/requeue."""

    def __init__(self, body=b"{}", **properties):
        self.properties = properties
        self.headers = {}
        self.body = body
        self.acknowledged = False
        self.outcome = None

    def _settle(self, outcome):
        assert not self.acknowledged, "message settled twice"
        self.acknowledged = True
        self.outcome = outcome

    def ack_log_error(self, logger, errors):
        self._settle("ack")

    def reject_log_error(self, logger, errors, requeue=False):
        self._settle("reject")

    def requeue(self):
        self._settle("requeue")


def _dispatcher(handler, **kwargs):
    rejected = []
    disp = d.TypeDispatcher({"REQUEST": handler},
                            on_reject=lambda m, reason: rejected.append(reason), **kwargs)
    return disp, rejected


def test_handler_properties():
    proc, val = (lambda data, msg: None), (lambda data: None)
    handler = d.Handler(proc, validator=val, required_properties=("reply_to",))
    assert handler.process_message is proc and handler.validator is val
    assert handler.required_properties == ("reply_to",)
    assert d.Handler(proc).validator is None


def test_message_is_acked_then_processed():
    seen = []
    disp, rejected = _dispatcher(d.Handler(lambda data, msg: seen.append((data, msg.outcome))))
    msg = FakeMessage(type="REQUEST")
    disp.on_message({"a": 1}, msg)
    assert seen == [({"a": 1}, "ack")] and not rejected


@pytest.mark.parametrize("props,needle", [
    ({}, "no 'type' property"),
    ({"type": "BOGUS"}, "unexpected message type 'BOGUS'"),
])
def test_missing_or_unknown_type_is_rejected(props, needle, caplog):
    disp, rejected = _dispatcher(d.Handler(lambda data, msg: pytest.fail("processed")))
    msg = FakeMessage(**props)
    with caplog.at_level(logging.WARNING):
        disp.on_message({}, msg)
    assert msg.outcome == "reject" and needle in rejected[0]
    assert needle in caplog.text and disp.rejected_count == 1


def test_missing_required_properties_are_named():
    disp, rejected = _dispatcher(d.Handler(lambda data, msg: pytest.fail("processed"),
                                           required_properties=("reply_to",
                                                                "correlation_id")))
    msg = FakeMessage(type="REQUEST", reply_to="r")
    disp.on_message({}, msg)
    assert msg.outcome == "reject"
    assert "lacks required property correlation_id" in rejected[0]


def test_invalid_body_is_rejected_with_the_validators_reason(caplog):
    def validator(data):
        raise exc.InvalidFormat("'task_cls' is a required property")

    disp, rejected = _dispatcher(d.Handler(lambda data, msg: pytest.fail("processed"),
                                           validator=validator))
    msg = FakeMessage(type="REQUEST")
    with caplog.at_level(logging.WARNING):
        disp.on_message({}, msg)
    assert rejected == ["'task_cls' is a required property"]
    assert "'task_cls' is a required property" in caplog.text
    assert msg.outcome == "ack"  # acked before validation, never redelivered


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
    disp = d.TypeDispatcher({"REQUEST": d.Handler(lambda data, msg: seen.append(data))},
                            requeue_filters=votes)
    later, now = FakeMessage(type="REQUEST"), FakeMessage(type="REQUEST")
    disp.on_message({"later": True}, later)
    disp.on_message({"later": False}, now)
    assert later.outcome == "requeue" and now.outcome == "ack" and seen == [{"later": False}]
    assert disp.requeue_filters == votes


def test_failing_requeue_filter_counts_as_no():
    def broken(data, msg):
        raise ValueError("nope")

    seen = []
    disp = d.TypeDispatcher({"REQUEST": d.Handler(lambda data, msg: seen.append(1))},
                            requeue_filters=[broken])
    disp.on_message({}, FakeMessage(type="REQUEST"))
    assert seen == [1]


def test_decode_error_is_a_rejection_with_an_excerpt():
    disp, rejected = _dispatcher(d.Handler(lambda data, msg: None))
    msg = FakeMessage(body=b"{not json", type="REQUEST")
    disp.on_decode_error(msg, ValueError("Expecting property name"))
    assert msg.outcome == "reject"
    assert "undecodable body" in rejected[0] and "{not json" in rejected[0]


def test_failing_on_reject_callback_is_contained(caplog):
    def on_reject(message, reason):
        raise RuntimeError("callback broke")

    disp = d.TypeDispatcher({}, on_reject=on_reject)
    msg = FakeMessage(type="X")
    disp.on_message({}, msg)
    assert msg.outcome == "reject" and "callback broke" in caplog.text


def test_type_handlers_property():
    handler = d.Handler(lambda data, msg: None)
    assert d.TypeDispatcher({"A": handler}).type_handlers == {"A": handler}
    assert d.TypeDispatcher().type_handlers == {}
