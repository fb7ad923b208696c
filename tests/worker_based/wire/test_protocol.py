"""Protocol: request state machine, message schemas (nested parts too), helpers."""

from __future__ import annotations

import copy
import json
import logging
import time

import pytest
import worker_tasks as wt
from hypothesis import given, settings
from hypothesis import strategies as st

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import schemas
from flowengine.types import failure as ft

SEED_TABLE = """\
+------------+------------+---------+----------+---------+
|   Start    |   Event    |   End   | On Enter | On Exit |
+------------+------------+---------+----------+---------+
| FAILURE[$] |     .      |    .    |    .     |    .    |
|  PENDING   | on_failure | FAILURE |    .     |    .    |
|  PENDING   | on_running | RUNNING |    .     |    .    |
|  RUNNING   | on_failure | FAILURE |    .     |    .    |
|  RUNNING   | on_success | SUCCESS |    .     |    .    |
| SUCCESS[$] |     .      |    .    |    .     |    .    |
| WAITING[^] | on_failure | FAILURE |    .     |    .    |
| WAITING[^] | on_pending | PENDING |    .     |    .    |
+------------+------------+---------+----------+---------+"""

SEED_TRACEBACK = (
    '  File "/homes/harlowja/dev/os/taskflow/taskflow/engines/action_engine/'
    'executor.py", line 56, in _execute_task\n    result = task.execute('
    '**arguments)\n  File "/homes/harlowja/dev/os/taskflow/taskflow/tests/'
    "utils.py\", line 165, in execute\n    raise RuntimeError('Woot!')\n"
)
SEED_FAILURE = {
    "exc_type_names": ["RuntimeError", "StandardError", "Exception"],
    "exception_str": "Woot!",
    "traceback_str": SEED_TRACEBACK,
    "version": 1,
}
SEED_EXECUTE = {
    "action": "execute",
    "arguments": {"x": 111},
    "task_cls": "taskflow.tests.utils.TaskOneArgOneReturn",
    "task_name": "taskflow.tests.utils.TaskOneArgOneReturn",
    "task_version": [1, 0],
}
SEED_REVERT = {
    "action": "revert",
    "arguments": {},
    "failures": {"taskflow.tests.utils.TaskWithFailure": SEED_FAILURE},
    "result": ["failure", SEED_FAILURE],
    "task_cls": "taskflow.tests.utils.TaskWithFailure",
    "task_name": "taskflow.tests.utils.TaskWithFailure",
    "task_version": [1, 0],
}
SEED_RUNNING = {"data": {}, "state": "RUNNING"}
SEED_PROGRESS = {"details": {"progress": 0.5}, "event_type": "update_progress", "state": "EVENT"}
SEED_SUCCESS = {"data": {"result": 666}, "state": "SUCCESS"}
SEED_FAILED = {"data": {"result": SEED_FAILURE}, "state": "FAILURE"}


def _failure() -> ft.Failure:
    try:
        raise RuntimeError("Woot!")
    except RuntimeError:
        return ft.Failure()


# --- the state machine ---


def test_machine_table_is_the_seed_table():
    assert pr.build_a_machine().pformat() == SEED_TABLE
    assert pr.Request.__doc__ and SEED_TABLE.splitlines()[3].strip() in pr.Request.__doc__


def test_build_a_machine_freeze_flag():
    frozen, loose = pr.build_a_machine(), pr.build_a_machine(freeze=False)
    assert frozen.frozen and not loose.frozen
    loose.add_state("EXTRA")  # allowed only when not frozen
    with pytest.raises(Exception):
        frozen.add_state("EXTRA")


def test_make_an_event():
    assert pr.make_an_event(pr.RUNNING) == "on_running"
    assert pr.make_an_event("Failure") == "on_failure"


def test_request_moves_through_allowed_states_only():
    req = pr.Request(wt.Add(), "u1", pr.EXECUTE, {"x": 1, "y": 2})
    assert req.current_state == pr.WAITING
    assert req.transition(pr.PENDING) is True
    assert req.transition(pr.PENDING) is False  # same state: ignored
    with pytest.raises(exc.InvalidState):
        req.transition(pr.SUCCESS)  # PENDING -> SUCCESS is not allowed
    assert req.transition(pr.RUNNING) and req.transition(pr.SUCCESS)
    assert req.current_state == pr.SUCCESS
    with pytest.raises(exc.InvalidState):
        req.transition(pr.RUNNING)  # terminal


def test_transition_and_log_error_logs_instead_of_raising(caplog):
    req = pr.Request(wt.Add(), "u1", pr.EXECUTE, {})
    logger = logging.getLogger("test-transition")
    with caplog.at_level(logging.WARNING, logger="test-transition"):
        assert req.transition_and_log_error(pr.SUCCESS, logger=logger) is False
    assert req.current_state == pr.WAITING
    assert "Failed to transition" in caplog.text and "SUCCESS" in caplog.text


def test_request_expires_only_while_waiting_or_pending():
    req = pr.Request(wt.Add(), "u1", pr.EXECUTE, {}, timeout=5)
    assert not req.expired
    req.created_on -= 10  # as if created 10 s ago
    assert req.expired
    req.transition(pr.PENDING)
    assert req.expired
    req.transition(pr.RUNNING)
    assert not req.expired  # RUNNING never expires
    unlimited = pr.Request(wt.Add(), "u2", pr.EXECUTE, {}, timeout=None)
    unlimited.created_on -= 10_000
    assert not unlimited.expired


def test_set_result_resolves_future_once():
    req = pr.Request(wt.Add(), "u1", pr.REVERT, {})
    assert req.set_result(5) is True
    assert req.set_result(6) is False
    assert req.future.result(0) == (pr.REVERTED, 5)
    assert req.future.atom.name == wt.Add().name


def test_request_rejects_unknown_action():
    with pytest.raises(ValueError, match="unknown|Unknown"):
        pr.Request(wt.Add(), "u1", "explode", {})


# --- request bodies ---


def test_request_to_dict_execute_is_valid_and_json():
    body = pr.Request(wt.Add(), "u1", pr.EXECUTE, {"x": 1, "y": 2}).to_dict()
    assert body == {
        "task_cls": "worker_tasks.Add",
        "task_name": "worker_tasks.Add",
        "task_version": [1, 0],
        "action": "execute",
        "arguments": {"x": 1, "y": 2},
    }
    pr.Request.validate(json.loads(json.dumps(body)))


def test_revert_request_round_trips_failures():
    fail = _failure()
    req = pr.Request(wt.Fail(), "u1", pr.REVERT, {}, result=fail, failures={"a": fail})
    body = json.loads(json.dumps(req.to_dict()))
    pr.Request.validate(body)
    assert body["result"][0] == "failure"
    unit = pr.Request.from_dict(body, task_uuid="u1")
    assert unit.task_cls == "worker_tasks.Fail" and unit.action == pr.REVERT
    assert unit.arguments["task_uuid"] == "u1"
    assert isinstance(unit.arguments["result"], ft.Failure)
    assert unit.arguments["result"].exception_str == "Woot!"
    assert unit.arguments["failures"]["a"].check(RuntimeError)


def test_revert_request_with_plain_result():
    body = pr.Request(wt.Add(), "u1", pr.REVERT, {}, result=3).to_dict()
    assert body["result"] == ["success", 3]
    assert pr.Request.from_dict(body).arguments["result"] == 3


@pytest.mark.parametrize("body", [SEED_EXECUTE, SEED_REVERT], ids=["execute", "revert"])
def test_seed_request_examples_are_valid(body):
    pr.Request.validate(copy.deepcopy(body))
    unit = pr.Request.from_dict(copy.deepcopy(body))
    assert unit.task_cls == body["task_cls"]


@pytest.mark.parametrize(
    "body",
    [SEED_RUNNING, SEED_PROGRESS, SEED_SUCCESS, SEED_FAILED],
    ids=["running", "progress", "success", "failure"],
)
def test_seed_response_examples_are_valid(body):
    pr.Response.validate(copy.deepcopy(body))
    resp = pr.Response.from_dict(copy.deepcopy(body))
    assert resp.state == body["state"]


def test_seed_progress_example_is_read_as_nested_event():
    resp = pr.Response.from_dict(copy.deepcopy(SEED_PROGRESS))
    assert resp.data == {"event_type": "update_progress", "details": {"progress": 0.5}}
    assert resp.to_dict() == {"state": "EVENT", "data": resp.data}


def test_seed_failure_response_becomes_failure_object():
    resp = pr.Response.from_dict(copy.deepcopy(SEED_FAILED))
    assert isinstance(resp.data["result"], ft.Failure)
    assert resp.data["result"].check(RuntimeError)


def test_notify_schemas_accept_seed_shapes():
    pr.Notify.validate({}, response=False)
    pr.Notify.validate({"topic": "t", "tasks": ["a.B"]}, response=True)
    with pytest.raises(exc.InvalidFormat, match="sender"):
        pr.Notify.validate({"topic": "t"}, response=False)
    with pytest.raises(exc.InvalidFormat, match="'tasks' is a required property"):
        pr.Notify.validate({"topic": "t"}, response=True)
    note = pr.Notify(topic="t", tasks=["x"])
    assert (note.topic, note.tasks, note.to_dict()) == ("t", ["x"], {"topic": "t", "tasks": ["x"]})


def test_schemas_are_the_seed_schemas():
    assert pr.Notify.SENDER_SCHEMA == {"additionalProperties": False, "type": "object"}
    assert pr.Request.SCHEMA["required"] == ["task_cls", "task_name", "task_version", "action"]
    assert pr.Response.SCHEMA["properties"]["state"]["enum"] == [
        "WAITING",
        "PENDING",
        "RUNNING",
        "SUCCESS",
        "FAILURE",
        "EVENT",
    ]


def _without(body, key):
    body = copy.deepcopy(body)
    del body[key]
    return body


def _with(body, path, value):
    body = copy.deepcopy(body)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    "body,needle",
    [
        (_without(SEED_EXECUTE, "task_cls"), "'task_cls' is a required property"),
        (_without(SEED_EXECUTE, "action"), "'action' is a required property"),
        (_with(SEED_EXECUTE, ["action"], "explode"), "'explode' is not one of"),
        (_with(SEED_EXECUTE, ["arguments"], [1]), "$.arguments"),
        (_with(SEED_EXECUTE, ["task_version"], 3), "$.task_version"),
        (_with(SEED_REVERT, ["result"], "oops"), "'result' must be"),
        (_with(SEED_REVERT, ["result"], ["maybe", 1]), "'result' must be"),
        (_with(SEED_REVERT, ["result", 1, "exception_str"], 5), "$.result[1]"),
        (_with(SEED_REVERT, ["result", 1, "version"], 2), "version 2 is not supported"),
        (
            _with(
                SEED_REVERT,
                ["failures", "taskflow.tests.utils.TaskWithFailure"],
                {"exception_str": "x"},
            ),
            "$.failures",
        ),
        (
            _with(
                SEED_REVERT,
                ["failures", "taskflow.tests.utils.TaskWithFailure", "exc_type_names"],
                ["Nope"],
            ),
            "initial exception",
        ),
        ([1, 2], "is not of type 'object'"),
    ],
)
def test_invalid_requests_are_rejected_naming_the_problem(body, needle):
    with pytest.raises(exc.InvalidFormat) as info:
        pr.Request.validate(body)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)  # one line: fit for logs and FAILURE replies


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"state": "RUNNING"}, "'data' is a required property"),
        ({"state": "BOGUS", "data": {}}, "'BOGUS' is not one of"),
        ({"state": "SUCCESS", "data": {}}, "needs data.result"),
        ({"state": "FAILURE", "data": {}}, "needs data.result"),
        ({"state": "FAILURE", "data": {"result": {"exception_str": "x"}}}, "$.data.result"),
        ({"state": "FAILURE", "data": {"result": dict(SEED_FAILURE, version=None)}}, "'version'"),
        (
            {
                "state": "FAILURE",
                "data": {"result": dict(SEED_FAILURE, causes=[dict(SEED_FAILURE, version=7)])},
            },
            "version 7",
        ),
        ({"state": "EVENT", "data": {}}, "needs data.event_type"),
        ({"state": "RUNNING", "data": {}, "extra": 1}, "Additional properties"),
    ],
)
def test_invalid_responses_are_rejected_naming_the_problem(body, needle):
    with pytest.raises(exc.InvalidFormat) as info:
        pr.Response.validate(body)
    assert needle in str(info.value)


def test_response_to_dict_encodes_failure():
    resp = pr.Response(pr.FAILURE, result=_failure())
    body = json.loads(json.dumps(resp.to_dict()))
    pr.Response.validate(body)
    assert body["data"]["result"]["exception_str"] == "Woot!"


def test_failure_to_dict_is_json_even_with_odd_args():
    fail = ft.Failure.from_exception(ValueError(object(), {1, 2}))
    json.dumps(pr.failure_to_dict(fail))


def test_validators_are_compiled_once_and_fast():
    validator = schemas.REQUEST_VALIDATOR
    body = pr.Request(wt.Add(), "u1", pr.EXECUTE, {"x": 1, "y": 2}).to_dict()
    start = time.perf_counter()
    for _ in range(2000):
        pr.Request.validate(body)
    elapsed = time.perf_counter() - start
    assert schemas.REQUEST_VALIDATOR is validator
    # TaskFlow rebuilt the validator per message (~0.8 ms each); a compiled
    # one takes a few microseconds. Generous bound for a loaded machine.
    assert elapsed < 1.0, f"2000 validations took {elapsed:.3f} s"


# --- helpers ---


def test_queue_and_key_helpers():
    assert pr.topic_queue_name("ex", "t") == "ex_t"
    assert pr.worker_routing_key("t", "h:1:ab") == "t.h:1:ab"
    assert pr.worker_queue_name("ex", "t", "h:1:ab") == "ex_t.h:1:ab"
    assert pr.reply_queue_name("ex", "u") == "ex_u"
    assert pr.ANNOUNCE_ROUTING_KEY == "flowengine.announce"
    host, pid, tag = pr.make_worker_id().split(":")
    assert pid.isdigit() and len(tag) == 8
    assert pr.make_worker_id() != pr.make_worker_id()


def test_header_names():
    assert (
        pr.HEADER_EXPIRES,
        pr.HEADER_ATTEMPT,
        pr.HEADER_ROOT_ID,
        pr.HEADER_PARENT_ID,
        pr.HEADER_ORIGIN,
        pr.HEADER_TIMELIMIT,
        pr.HEADER_WORKER_ID,
    ) == ("expires", "attempt", "root_id", "parent_id", "origin", "timelimit", "worker_id")


def test_parse_expires():
    assert pr.parse_expires(None) is None
    assert pr.parse_expires(12.5) == 12.5
    assert pr.parse_expires("12.5") == 12.5
    assert pr.parse_expires("1970-01-01T00:01:00+00:00") == 60.0
    assert pr.parse_expires("1970-01-01T00:01:00") == 60.0  # naive means UTC
    for bad in ("soon", True, [1]):
        with pytest.raises(exc.InvalidFormat, match="expires"):
            pr.parse_expires(bad)


# --- property: validation never fails with anything but InvalidFormat ---

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "task_cls": json_values | st.text(),
        "task_name": json_values,
        "task_version": json_values,
        "action": st.sampled_from(["execute", "revert", "x"]) | json_values,
        "arguments": json_values,
        "result": json_values,
        "failures": json_values,
    },
)
response_like = st.fixed_dictionaries(
    {},
    optional={
        "state": st.sampled_from(["RUNNING", "SUCCESS", "FAILURE", "EVENT"]) | json_values,
        "data": json_values,
        "event_type": json_values,
    },
)


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
@settings(max_examples=150)
@given(body=json_values | request_like)
def test_request_validation_only_raises_invalid_format(body):
    try:
        pr.Request.validate(body)
    except exc.InvalidFormat:
        return
    pr.Request.from_dict(body)  # valid input must decode


@settings(max_examples=150)
@given(body=json_values | response_like)
def test_response_validation_only_raises_invalid_format(body):
    try:
        pr.Response.validate(body)
    except exc.InvalidFormat:
        return
    pr.Response.from_dict(body)
