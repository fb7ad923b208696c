"""The validation fast paths: they may only accept bodies the schemas accept.

``wire.schemas.response_fast`` / ``request_fast`` skip jsonschema for the usual
message shapes. Generated bodies close to those shapes (and far from them)
must never be accepted by a fast path while the compiled schema rejects them;
the usual shapes must take the fast path.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import schemas

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
STATES = st.sampled_from(
    ["WAITING", "PENDING", "RUNNING", "SUCCESS", "FAILURE", "EVENT", "running", "", "OTHER"]
)
PAYLOADS = st.one_of(
    st.just({}),
    JSON,
    st.fixed_dictionaries({"result": JSON}),
    st.fixed_dictionaries({"event_type": JSON, "details": JSON}),
    st.fixed_dictionaries({"event_type": st.text(max_size=5), "details": st.just({})}),
    st.dictionaries(st.sampled_from(["result", "event_type", "details", "x"]), JSON, max_size=3),
)
RESPONSES = st.one_of(
    st.fixed_dictionaries({"state": STATES | JSON, "data": PAYLOADS}),
    st.fixed_dictionaries({"state": STATES, "data": PAYLOADS}, optional={"extra": JSON}),
    st.dictionaries(st.sampled_from(["state", "data"]), JSON, max_size=2),
    JSON,
)
REQUESTS = st.one_of(
    st.fixed_dictionaries(
        {
            "task_cls": st.text(max_size=5) | JSON,
            "task_name": st.text(max_size=5) | JSON,
            "task_version": st.text(max_size=3) | st.lists(st.integers(), max_size=2) | JSON,
            "action": st.sampled_from(["execute", "revert", "EXECUTE", ""]) | JSON,
        },
        optional={
            "arguments": st.just({}) | JSON,
            "failures": st.just({}) | JSON,
            "result": JSON,
            "other": JSON,
        },
    ),
    st.dictionaries(
        st.sampled_from(["task_cls", "task_name", "task_version", "action"]),
        st.text(max_size=3),
        max_size=4,
    ),
    JSON,
)


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
@settings(max_examples=400)
@given(RESPONSES)
def test_response_fast_path_accepts_only_schema_valid_bodies(body):
    if schemas.response_fast(body):
        assert schemas.RESPONSE_VALIDATOR.is_valid(body), body


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
@settings(max_examples=400)
@given(REQUESTS)
def test_request_fast_path_accepts_only_schema_valid_bodies(body):
    if schemas.request_fast(body):
        assert schemas.REQUEST_VALIDATOR.is_valid(body), body


def test_usual_messages_take_the_fast_path():
    for state, data in (
        ("PENDING", {}),
        ("RUNNING", {}),
        ("SUCCESS", {"result": [1, "x"]}),
        ("FAILURE", {"result": {"exc_type_names": ["RuntimeError"]}}),
        ("EVENT", {"event_type": "update_progress", "details": {"progress": 0.5}}),
    ):
        assert schemas.response_fast({"state": state, "data": data}), state
    request = {
        "task_cls": "m.T",
        "task_name": "t",
        "task_version": [1, 0],
        "action": "execute",
        "arguments": {"x": 1},
    }
    assert schemas.request_fast(request)
    assert schemas.request_fast(dict(request, action="revert", result=None, failures={}))


def test_invalid_bodies_still_fail_with_the_schema_message():
    for bad in ({"state": "SUCCESS", "data": {"result": 1, "x": 2}}, {"state": 1, "data": {}}):
        assert not schemas.response_fast(bad)
        try:
            pr.Response.validate(bad)
        except Exception as e:  # InvalidFormat, from the full validator
            assert "not of the expected format" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")
