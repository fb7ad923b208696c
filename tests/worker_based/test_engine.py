"""WorkerBasedActionEngine: options, flows on in-process workers and on worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.demo import flow as demo_flow
from flowengine.demo import tasks as demo_tasks
from flowengine.engines.worker_based.executor_side import engine as wbe
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from tests.worker_based import executor_tasks as et
from tests.worker_based.executor_helpers import (
    MEMORY,
    WAIT_S,
    running_executor,
    running_worker,
    unique,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(flow, exchange, topics=("t",), store=None, **options):
    return engines.load(
        flow,
        store=store,
        engine="worker-based",
        exchange=exchange,
        topics=list(topics),
        **{**MEMORY, **options},
    )


def test_engine_is_registered_and_builds_executor_from_options():
    engine = _load(
        lf.Flow("f").add(et.Echo("e")),
        unique(),
        topics=["a", "b"],
        transition_timeout=5,
        worker_expiry=7,
    )
    assert isinstance(engine, wbe.WorkerBasedActionEngine)
    executor = engine._task_executor
    assert isinstance(executor, wex.WorkerTaskExecutor)
    assert executor.finder.topics == ["a", "b"]
    assert executor.policy.transition_timeout == 5


def test_executor_option_is_used():
    exchange = unique()
    executor = wex.WorkerTaskExecutor("given", exchange, ["t"], **MEMORY)
    engine = engines.load(
        lf.Flow("f").add(et.Echo("e")), engine="worker-based", executor=executor, store={"value": 1}
    )
    assert engine._task_executor is executor
    with running_worker(exchange, "t", [et.Echo]):
        engine.run()
    assert engine.storage.fetch("value") == 1


def test_bad_executor_option_is_refused_at_load():
    with pytest.raises(TypeError, match="executor"):
        engines.load(lf.Flow("f").add(et.Echo("e")), engine="worker-based", executor=object())


def test_linear_flow_results_and_progress_reach_the_notifier():
    exchange = unique()
    flow = lf.Flow("f").add(
        et.Echo("e1", provides="a", rebind={"value": "x"}),
        demo_tasks.Combine("c", provides="b", rebind={"left": "a", "right": "x"}),
        et.Progress("p", provides="done"),
    )
    with running_worker(exchange, "t", [et.Echo, et.Progress, demo_tasks.Combine]):
        engine = _load(flow, exchange, store={"x": 20})
        progress = []
        engine.atom_notifier.register(
            "update_progress", lambda event, details: progress.append(details)
        )
        engine.run()
    assert engine.storage.fetch_all()["b"] == 40
    assert engine.storage.fetch("done") == "done"
    assert [(d["task_name"], d["progress"]) for d in progress] == [("p", 0.5)]
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_remote_progress_reaches_the_engine_side_task_notifier():
    # Given a listener on the task object the flow was built with (TaskFlow's
    # way of watching progress), when the task runs on a remote worker,
    exchange = unique()
    task = et.Progress("p", provides="done")
    heard = []
    task.notifier.register(
        "update_progress", lambda event, details: heard.append(details["progress"])
    )
    with running_worker(exchange, "t", [et.Progress]):
        _load(lf.Flow("f").add(task), exchange).run()
    # then it hears the worker's 0.5 between the engine's own 0.0 and 1.0.
    assert heard == [0.0, 0.5, 1.0]


def test_any_event_a_remote_task_notifies_reaches_the_engine_side_task():
    # Given a listener for a custom event on the flow's own task object
    exchange = unique()
    task = et.Announcing("a")
    heard = []
    task.notifier.register("stage-reached", lambda event, details: heard.append(details))
    # When the task notifies it on a remote worker
    with running_worker(exchange, "t", [et.Announcing]):
        _load(lf.Flow("f").add(task), exchange).run()
    # Then the listener hears it, as it would locally
    assert heard == [{"stage": "halfway"}]


def test_failure_reverts_and_revert_gets_the_failures():
    # Given a flow whose second task fails on the worker
    exchange = unique()
    flow = lf.Flow("f").add(et.RevertRecorder("rec"), et.Fail("boom"))
    with running_worker(exchange, "t", [et.RevertRecorder, et.Fail]):
        engine = _load(flow, exchange)
        # When it runs, the remote failure comes back (as TaskFlow: wrapped,
        # since the exception object itself never crosses the wire)
        with pytest.raises(exc.WrappedFailure) as info:
            engine.run()
        assert info.value.check(RuntimeError) is not None
    # Then the first task was reverted remotely with its result and the failures
    assert engine.storage.get_atom_state("rec") == states.REVERTED
    assert engine.storage.get_revert_result("rec") == {"result": 1, "failures": {"boom": "Woot!"}}


def test_request_timeout_when_no_worker_can_run_a_task():
    exchange = unique()
    flow = lf.Flow("f").add(et.Echo("e"))
    with running_worker(exchange, "t", [et.Other]):
        engine = _load(flow, exchange, store={"value": 1}, transition_timeout=0.2)
        with pytest.raises(exc.RequestTimeout):
            engine.run()


def test_worker_started_after_the_engine():
    exchange = unique()
    flow = uf.Flow("f").add(*[et.Echo(f"e{i}", provides=f"o{i}") for i in range(5)])
    engine = _load(flow, exchange, store={"value": "v"})
    errors: list[BaseException] = []

    def run():
        try:
            engine.run()
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    with running_executor(exchange, ["t"]) as watcher:
        runner = threading.Thread(target=run)
        runner.start()
        # The engine waits (no worker yet); then a worker comes up
        with running_worker(exchange, "t", [et.Echo]):
            assert watcher.wait_for_workers(1, WAIT_S) == 0
            runner.join(WAIT_S)
    assert not runner.is_alive() and errors == []
    assert [engine.storage.fetch(f"o{i}") for i in range(5)] == ["v"] * 5


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_demo_flow_on_a_worker_process_over_filesystem(tmp_path):
    # Given a real worker process on flowengine's filesystem transport
    exchange = unique()
    conn = {"transport": "filesystem", "transport_options": {"data_folder": str(tmp_path)}}
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "worker",
        "--exchange",
        exchange,
        "--topic",
        "t",
        "--tasks",
        "flowengine.demo.tasks",
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={tmp_path}",
    ]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)]
    try:
        with running_executor(exchange, ["t"], **conn) as executor:
            assert executor.wait_for_workers(1, WAIT_S) == 0
            # When the 32-task demo flow runs on them
            engine = engines.load(demo_flow.make_flow(), engine="worker-based", executor=executor)
            engine.run()
        # Then it computes the right total
        assert (
            engine.storage.fetch("report")
            == f"8 sources, sum of squares = {demo_flow.expected_total()}"
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            assert proc.wait(WAIT_S) == 0
