"""The worker's one middleware list: the order of its hooks for each kind of request.

A real Worker over the memory transport, driven by a stand-in executor
(:class:`wire_helpers.Client`); a recording middleware added with
``Worker(middleware=[...])`` sees every hook point of every request.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import worker_tasks as wt
from wire_helpers import WAIT_S, Client, running_worker

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.worker_side import activity as activity_mod
from flowengine.engines.worker_based.worker_side.middleware import Job, Middleware
from flowengine.engines.worker_based.worker_side.worker_events import EventsMiddleware
from flowengine.types import failure as ft

TOPIC = "mw"
MEMORY = {"transport": "memory"}

#: The hooks of a request that ran, in the order the worker calls them.
RAN = [
    "after_receive",
    "refuse_start",
    "before_execute",
    "override_result",
    "after_execute",
    "after_reply",
    "after_release",
]


class Recorder(Middleware):
    """Records (hook, request uuid, detail) for every hook; tests wait on it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.threads: dict[tuple[str, str], int] = {}
        self._cond = threading.Condition()

    def _record(self, hook: str, key: str, detail: Any = None) -> None:
        with self._cond:
            self.calls.append((hook, key, detail))
            self.threads[(hook, key)] = threading.get_ident()
            self._cond.notify_all()

    def hooks_of(self, key: str) -> list[str]:
        with self._cond:
            return [hook for hook, k, _ in self.calls if k == key]

    def detail(self, hook: str, key: str) -> Any:
        with self._cond:
            return next(d for h, k, d in self.calls if h == hook and k == key)

    def wait_for(self, hook: str, key: str) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: hook in self.hooks_of(key), WAIT_S)

    def after_receive(self, job: Job) -> None:
        self._record("after_receive", job.task_uuid, job.topic)

    def refuse_start(self, job: Job) -> BaseException | None:
        self._record("refuse_start", job.task_uuid)
        return None

    def after_refuse(self, job: Job, error: BaseException) -> None:
        self._record("after_refuse", job.task_uuid, type(error).__name__)

    def before_execute(self, job: Job) -> None:
        self._record("before_execute", job.task_uuid)

    def on_progress(self, job: Job, event_type: str, details: Mapping[str, Any]) -> None:
        self._record("on_progress", job.task_uuid, details.get("progress"))

    def override_result(self, job: Job, result: Any) -> Any:
        self._record("override_result", job.task_uuid)
        return result

    def after_execute(self, job: Job, result: Any, elapsed_s: float) -> None:
        self._record("after_execute", job.task_uuid, result)

    def after_reply(self, job: Job, result: Any, elapsed_s: float) -> None:
        self._record("after_reply", job.task_uuid)

    def after_release(self, job: Job) -> None:
        self._record("after_release", job.task_uuid)

    def after_expire(
        self, topic: str, task_uuid: str, task_name: str | None, headers: Headers
    ) -> None:
        self._record("after_expire", task_uuid, topic)

    def after_consumer_start(self, topic: str) -> None:
        self._record("after_consumer_start", topic)

    def after_server_stop(self, topic: str) -> None:
        self._record("after_server_stop", topic)


class Broken(Middleware):
    """Raises in every request hook (a buggy user middleware)."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith(("after_", "before_", "on_", "refuse_", "override_")):

            def broken(*args: Any) -> None:
                raise RuntimeError(f"broken {name}")

            return broken
        return super().__getattribute__(name)


@pytest.fixture
def served(unique_name: str) -> Iterator[tuple[Client, Any, Recorder]]:
    recorder = Recorder()
    with (
        Client(unique_name, **MEMORY) as client,
        running_worker(
            unique_name, TOPIC, ["worker_tasks"], threads_count=2, middleware=[recorder], **MEMORY
        ) as worker,
    ):
        yield client, worker, recorder


def _send(client: Client, task: Any, cid: str, headers: dict[str, Any] | None = None) -> None:
    client.proxy.publish(
        pr.Request(task, cid, pr.EXECUTE, {}),
        TOPIC,
        reply_to=client.uuid,
        correlation_id=cid,
        headers=headers,
    )


def test_the_worker_walks_one_list_built_ins_first_then_yours(served):
    _client, worker, recorder = served
    # Given a worker with a middleware of ours: it comes last, after the
    # activity (which counts a request) and the events (which announce its end)
    kinds = [type(m) for m in worker.middleware]
    assert worker.middleware[-1] is recorder
    assert kinds.index(activity_mod.Activity) < kinds.index(EventsMiddleware)
    assert all(server.middleware == worker.middleware for server in worker.servers)
    # And it heard the consume loop start
    assert recorder.wait_for("after_consumer_start", TOPIC)


def test_a_successful_request_goes_through_every_hook_in_order(served):
    client, _worker, recorder = served
    # When a request whose task reports progress twice succeeds
    cid = client.request(wt.Progress(), routing_key=TOPIC)
    assert client.final(cid)["state"] == pr.SUCCESS
    assert recorder.wait_for("after_release", cid)
    # Then each hook was called once, in order, progress while the body ran
    assert recorder.hooks_of(cid) == [*RAN[:3], "on_progress", "on_progress", *RAN[3:]]
    assert recorder.detail("after_receive", cid) == TOPIC
    assert recorder.detail("after_execute", cid) == "done"
    # ...and the body's hooks on the thread that ran it
    assert recorder.threads[("before_execute", cid)] == recorder.threads[("after_execute", cid)]


def test_a_failed_request_goes_through_the_same_hooks_with_its_failure(served):
    client, _worker, recorder = served
    cid = client.request(wt.Fail(), routing_key=TOPIC)
    assert client.final(cid)["state"] == pr.FAILURE
    assert recorder.wait_for("after_release", cid)
    assert recorder.hooks_of(cid) == RAN
    result = recorder.detail("after_execute", cid)
    assert isinstance(result, ft.Failure) and result.check(RuntimeError)


def test_a_cancelled_request_is_vetoed_before_it_starts(served):
    client, worker, recorder = served
    # Given a cancellation of a request the worker does not hold yet
    cid = uuid.uuid4().hex
    assert worker.cancel(cid)["held"] is False
    # When the request arrives
    _send(client, wt.Add(), cid)
    final = client.final(cid)
    # Then the activity vetoed it (ours, after it in the list, was not asked):
    # answered with RequestCancelled, never run, released
    assert "RequestCancelled" in str(final["data"]["result"]["exc_type_names"])
    assert recorder.wait_for("after_release", cid)
    assert recorder.hooks_of(cid) == ["after_receive", "after_refuse", "after_release"]
    assert recorder.detail("after_refuse", cid) == "RequestCancelled"
    assert client.states(cid) == [pr.FAILURE]


def test_an_expired_request_is_dropped_with_only_after_expire(served):
    client, _worker, recorder = served
    # When a request arrives past its expiry
    cid = uuid.uuid4().hex
    _send(client, wt.Add(), cid, headers={pr.HEADER_EXPIRES: time.time() - 5})
    final = client.final(cid)
    assert "RequestExpired" in str(final["data"]["result"]["exc_type_names"])
    # Then the middleware heard only that (it was never taken)
    assert recorder.wait_for("after_expire", cid)
    assert recorder.hooks_of(cid) == ["after_expire"]
    assert recorder.detail("after_expire", cid) == TOPIC


def test_a_raising_middleware_is_logged_and_breaks_nothing(unique_name, caplog):
    recorder = Recorder()
    # Given a middleware raising in every hook, before ours
    with (
        caplog.at_level(logging.ERROR),
        Client(unique_name, **MEMORY) as client,
        running_worker(
            unique_name,
            TOPIC,
            ["worker_tasks"],
            threads_count=2,
            middleware=[Broken(), recorder],
            **MEMORY,
        ),
    ):
        # When a request runs
        cid = client.request(wt.Add(), arguments={"x": 1, "y": 2}, routing_key=TOPIC)
        # Then it succeeds as if nothing were wrong, not vetoed by the raising
        # refuse_start nor changed by the raising override_result
        assert client.final(cid) == {"state": pr.SUCCESS, "data": {"result": 3}}
        assert recorder.wait_for("after_release", cid)
        # And the middleware after the broken one heard every hook
        assert recorder.hooks_of(cid) == RAN
    # And each failure was logged, naming the hook
    for hook in (
        "after_receive",
        "refuse_start",
        "before_execute",
        "after_execute",
        "after_release",
    ):
        assert f"failed in {hook}" in caplog.text, hook
    # The server stopped cleanly too: the last hook heard
    assert recorder.hooks_of(TOPIC)[-1] == "after_server_stop"
