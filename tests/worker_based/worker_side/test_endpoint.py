"""Endpoint: builds tasks by name, runs execute/revert, never raises."""

from __future__ import annotations

import pytest
import worker_tasks as wt

from flowengine import task
from flowengine.engines.worker_based.worker_side import endpoint as ep
from flowengine.types import failure as ft


class PostHookBreaks(task.Task):
    def execute(self):
        return 7

    def post_execute(self):
        raise RuntimeError("post hook")


def test_name_is_fully_qualified_class_name():
    endpoint = ep.Endpoint(wt.Add)
    assert endpoint.name == "worker_tasks.Add" == str(endpoint)
    assert endpoint.task_cls is wt.Add


def test_generate_names_the_task():
    made = ep.Endpoint(wt.Add).generate(name="adder")
    assert isinstance(made, wt.Add) and made.name == "adder"
    assert ep.Endpoint(wt.Add).generate().name == "worker_tasks.Add"


def test_generate_fails_for_classes_needing_more_than_a_name():
    with pytest.raises(TypeError):
        ep.Endpoint(wt.NeedsArg).generate(name="n")


def test_execute_returns_result():
    endpoint = ep.Endpoint(wt.Add)
    assert endpoint.execute(endpoint.generate(), arguments={"x": 2, "y": 3}) == 5


def test_execute_failure_is_returned_not_raised():
    endpoint = ep.Endpoint(wt.Fail)
    result = endpoint.execute(endpoint.generate(), arguments={})
    assert isinstance(result, ft.Failure) and result.check(RuntimeError)
    assert result.exception_str == "Woot!"


def test_bad_arguments_become_a_failure():
    endpoint = ep.Endpoint(wt.Add)
    result = endpoint.execute(endpoint.generate(), arguments={"x": 1})
    assert isinstance(result, ft.Failure) and result.check(TypeError)


def test_progress_reaches_the_callback_only_while_running():
    events = []
    endpoint = ep.Endpoint(wt.Progress)
    made = endpoint.generate()

    def record(event_type, details):
        events.append((event_type, details))

    assert endpoint.execute(made, progress_callback=record) == "done"
    assert events == [
        ("update_progress", {"progress": 0.5}),
        ("update_progress", {"progress": 1.0}),
    ]
    made.update_progress(0.2)  # after the run: callback deregistered
    assert len(events) == 2


def test_revert_gets_result_and_flow_failures():
    fail = ft.Failure.from_exception(RuntimeError("x"))
    endpoint = ep.Endpoint(wt.Fail)
    out = endpoint.revert(
        endpoint.generate(),
        arguments={},
        result=fail,
        failures={"a": fail, "b": fail},
        task_uuid="ignored",
    )
    assert out == {"result_type": "Failure", "failures": ["a", "b"]}


def test_post_hook_error_does_not_replace_the_result(caplog):
    endpoint = ep.Endpoint(PostHookBreaks)
    assert endpoint.execute(endpoint.generate()) == 7
    assert "post hook" in caplog.text
