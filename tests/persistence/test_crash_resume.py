"""An engine process killed (SIGKILL) mid-flow resumes from the backend in a new one."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from flowengine import states
from tests.persistence import child, flows
from tests.persistence.procs import Child
from tests.persistence.stores import Store, store_url

# Out of the fast tier (tests/fast_tier.py): runs engines in processes it kills.
pytestmark = pytest.mark.broker


def _stored_states(store, flow_uuid):
    with contextlib.closing(store.open().get_connection()) as conn:
        fd = conn.get_flow_details(flow_uuid)
    return fd.state, {ad.name: ad.state for ad in fd if not ad.name.startswith("_")}


def test_killed_engine_resumes_without_rerunning_finished_atoms(durable_store, tmp_path):
    _crash_and_resume(durable_store, tmp_path, "serial")


def test_killed_parallel_engine_resumes(tmp_path, request):
    store = Store("sqlite", store_url("sqlite", tmp_path, request))
    try:
        _crash_and_resume(store, tmp_path, "parallel")
    finally:
        store.close()


def _crash_and_resume(durable_store, tmp_path, engine):
    effects = os.path.join(tmp_path, "effects.txt")
    # Given an engine process that is running task 'b' (a already finished)
    first = Child("start", durable_store.url, effects, engine, env={flows.BLOCK_ENV: "b"})
    try:
        flow_uuid = first.wait_for("FLOW ").split()[1]
        first.wait_for("BLOCKED b")
        # When it is killed with SIGKILL
        first.kill9()
    finally:
        first.close()
    # Then the backend shows a done, b interrupted while RUNNING, c not started
    assert _stored_states(durable_store, flow_uuid) == (
        states.RUNNING,
        {"a": states.SUCCESS, "b": states.RUNNING, "c": states.PENDING},
    )
    assert flows.executions(effects) == {"a": 1, "b": 1}
    # When a new process resumes the saved flow detail
    second = Child("resume", durable_store.url, flow_uuid, engine)
    try:
        assert second.finish() == states.SUCCESS
    finally:
        second.close()
    # Then a ran once in all, b ran again, c ran once, and the flow succeeded
    assert flows.executions(effects) == {"a": 1, "b": 2, "c": 1}
    assert _stored_states(durable_store, flow_uuid) == (
        states.SUCCESS,
        {"a": states.SUCCESS, "b": states.SUCCESS, "c": states.SUCCESS},
    )
    with contextlib.closing(durable_store.open().get_connection()) as conn:
        results = {ad.name: ad.results for ad in conn.get_flow_details(flow_uuid)}
    assert (results["a"], results["b"], results["c"]) == (1, 11, 111)


def test_killed_worker_based_engine_resumes(tmp_path, request):
    # Given a worker process serving the flow's tasks over a filesystem broker
    store = Store("sqlite", store_url("sqlite", tmp_path, request))
    effects = os.path.join(tmp_path, "effects.txt")
    broker_dir = str(tmp_path / "broker")
    os.mkdir(broker_dir)
    exchange, topic = "crash-test", "crash-tasks"
    options = {
        "exchange": exchange,
        "topics": [topic],
        "transport": "filesystem",
        "transport_options": child.filesystem_transport(broker_dir),
    }
    env = {child.OPTIONS_ENV: json.dumps(options)}
    worker = Child("worker", exchange, topic, broker_dir, env={flows.BLOCK_ENV: "b"})
    try:
        worker.wait_for("WORKER READY")
        # And a worker-based engine process whose task 'b' is running on that worker
        first = Child("start", store.url, effects, "worker-based", env=env)
        try:
            flow_uuid = first.wait_for("FLOW ").split()[1]
            worker.wait_for("BLOCKED b")
            # When the engine process is killed with SIGKILL
            first.kill9()
        finally:
            first.close()
        assert _stored_states(store, flow_uuid) == (
            states.RUNNING,
            {"a": states.SUCCESS, "b": states.RUNNING, "c": states.PENDING},
        )
        # And a new engine process resumes the flow on the same worker
        second = Child("resume", store.url, flow_uuid, "worker-based", env=env)
        try:
            assert second.finish() == states.SUCCESS
        finally:
            second.close()
    finally:
        worker.close()
        store.close()
    # Then only the interrupted task ran again
    assert flows.executions(effects) == {"a": 1, "b": 2, "c": 1}
    assert _stored_states(store, flow_uuid)[0] == states.SUCCESS
