"""Mixed fleets in one process over the memory transport.

Each flow runs four ways: all-TaskFlow, TaskFlow engine on flowengine
workers, flowengine engine on TaskFlow workers, all-flowengine. The outcome
(results, atom states, errors, progress heard, reverts done) must be the
same every way, and the one expected.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")

from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from tests.interop import harness
from tests.interop import shared_tasks as st

FLEETS = [
    ("taskflow", "taskflow"),
    ("taskflow", "flowengine"),
    ("flowengine", "taskflow"),
    ("flowengine", "flowengine"),
]

EXPECTED = {
    "linear": {"results": {"x": 4, "y": 5, "z": 50}, "error": None},
    "graph": {"results": {"seed": 2, "a": 3, "b": 6, "c": 9, "joined": [6, 9, 15]}, "error": None},
    "failing": {"error": [("RuntimeError", st.BOOM_MESSAGE)]},
    "progress": {"results": {"x": 5, "tripled": 15}, "error": None},
}


@pytest.fixture(autouse=True)
def _fast_taskflow(monkeypatch):
    from taskflow.engines.worker_based import proxy

    monkeypatch.setattr(proxy, "DRAIN_EVENTS_PERIOD", harness.TASKFLOW_DRAIN_PERIOD_S)


def memory_options(library: str, mixed: bool) -> dict:
    """Engine/worker options for ``library`` on the memory transport."""
    if library == "taskflow":
        return {
            "transport": "memory",
            "transport_options": {"polling_interval": harness.TASKFLOW_MEMORY_POLL_S},
        }
    options = {"transport": "memory"}
    if mixed:
        options["compat"] = "taskflow"
    return options


def run_on_fleet(kind: str, engine_lib: str, worker_lib: str, folder) -> dict:
    """Run the ``kind`` flow with an engine of one library on a worker of the other."""
    mixed = engine_lib != worker_lib
    exchange, topic = f"interop-{uuid.uuid4().hex[:8]}", "shared"
    marker_dir = folder / f"{engine_lib}-on-{worker_lib}"
    marker_dir.mkdir()
    with harness.thread_worker(
        worker_lib, st.build(worker_lib), exchange, topic, **memory_options(worker_lib, mixed)
    ):
        return harness.run_flow(
            engine_lib,
            kind,
            st.build(engine_lib),
            str(marker_dir),
            exchange=exchange,
            topics=[topic],
            **memory_options(engine_lib, mixed),
        )


@pytest.mark.slow  # four fleets, each with its own worker: ~3 s
@pytest.mark.parametrize("kind", st.FLOW_KINDS)
def test_same_outcome_on_every_fleet(kind, tmp_path):
    # Given the same flow for an all-TaskFlow, two mixed and an all-flowengine fleet
    # When it runs on each
    outcomes = {fleet: run_on_fleet(kind, *fleet, tmp_path) for fleet in FLEETS}
    # Then every fleet gives the all-TaskFlow outcome, which is the expected one
    reference = outcomes[("taskflow", "taskflow")]
    for fleet, outcome in outcomes.items():
        assert outcome == reference, f"{fleet} differs from all-TaskFlow"
    for key, value in EXPECTED[kind].items():
        assert reference[key] == value
    if kind == "failing":
        assert set(reference["states"].values()) == {"REVERTED"}
        assert reference["markers"] == {
            "first.executed": "",
            "second.executed": "",
            "first.reverted": "'first ran'",
            "second.reverted": "'second ran'",
        }
    else:
        assert set(reference["states"].values()) == {"SUCCESS"}
    if kind == "progress":
        assert reference["progress"] == list(st.PROGRESS_STEPS)


def test_taskflow_engine_discovers_flowengine_worker():
    # Given a flowengine worker (compat='taskflow') and a TaskFlow executor
    from taskflow.engines.worker_based import executor as tf_executor

    exchange, topic = f"interop-{uuid.uuid4().hex[:8]}", "shared"
    tf_tasks = st.build("taskflow")
    with harness.thread_worker(
        "flowengine", st.build("flowengine"), exchange, topic, **memory_options("flowengine", True)
    ):
        executor = tf_executor.WorkerTaskExecutor(
            uuid.uuid4().hex, exchange, [topic], **memory_options("taskflow", True)
        )
        executor.start()
        try:
            # When it sends NOTIFY
            missing = executor.wait_for_workers(1, timeout=harness.WORKER_START_S)
            # Then the worker's answer tells it every shared task is runnable there
            assert missing == 0
            for name in st.TASK_NAMES:
                worker = executor._finder.get_worker_for_task(getattr(tf_tasks, name)())
                assert worker is not None and worker.topic == topic, name
        finally:
            executor.stop()


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_flowengine_engine_discovers_taskflow_worker(caplog):
    # Given a TaskFlow worker and a flowengine executor (compat='taskflow')
    from flowengine.engines.worker_based.executor_side import executor as fe_executor

    exchange, topic = f"interop-{uuid.uuid4().hex[:8]}", "shared"
    with harness.thread_worker(
        "taskflow", st.build("taskflow"), exchange, topic, **memory_options("taskflow", True)
    ):
        executor = fe_executor.WorkerTaskExecutor(
            uuid.uuid4().hex,
            exchange,
            [topic],
            broker=BrokerSettings(**memory_options("flowengine", True)),
        )
        executor.start()
        try:
            # When it sends NOTIFY
            missing = executor.wait_for_workers(1, timeout=harness.WORKER_START_S)
            # Then it knows the TaskFlow worker (no worker id) and its tasks
            assert missing == 0
            [worker] = executor.finder.workers
            assert worker.worker_id is None and worker.topic == topic
            assert sorted(worker.tasks) == sorted(f"{st.__name__}.{n}" for n in st.TASK_NAMES)
        finally:
            executor.stop()


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_mixed_runs_warn_once_about_what_is_lost(tmp_path, caplog):
    # Given a flowengine engine on a TaskFlow worker, then a TaskFlow engine on a
    # flowengine worker
    caplog.set_level("WARNING", logger="flowengine.engines.worker_based.messaging.compat")
    run_on_fleet("linear", "flowengine", "taskflow", tmp_path)
    run_on_fleet("linear", "taskflow", "flowengine", tmp_path)
    # Then each side said once (not once per request) what degrades
    messages = [r.getMessage() for r in caplog.records]
    by_worker = [m for m in messages if "is run by a TaskFlow worker" in m]
    by_engine = [m for m in messages if "comes from a TaskFlow engine" in m]
    assert len(by_worker) == 1 and "heartbeats" in by_worker[0]
    assert len(by_engine) == 1 and "expires" in by_engine[0]


def test_all_flowengine_run_warns_about_nothing(tmp_path, caplog):
    caplog.set_level("WARNING", logger="flowengine.engines.worker_based.messaging.compat")
    run_on_fleet("linear", "flowengine", "flowengine", tmp_path)
    assert not caplog.records


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
@pytest.mark.parametrize("engine_lib", ["taskflow", "flowengine"])
def test_both_kinds_of_worker_on_one_topic(engine_lib, tmp_path):
    # Given a TaskFlow and a flowengine worker consuming the same topic queue
    # (a fleet half-way through its rollover)
    exchange, topic = f"interop-{uuid.uuid4().hex[:8]}", "shared"
    with (
        harness.thread_worker(
            "taskflow", st.build("taskflow"), exchange, topic, **memory_options("taskflow", True)
        ),
        harness.thread_worker(
            "flowengine",
            st.build("flowengine"),
            exchange,
            topic,
            **memory_options("flowengine", True),
        ),
    ):
        # When an engine of either library runs flows there
        for kind in ("graph", "failing"):
            marker_dir = tmp_path / kind
            marker_dir.mkdir()
            outcome = harness.run_flow(
                engine_lib,
                kind,
                st.build(engine_lib),
                str(marker_dir),
                exchange=exchange,
                topics=[topic],
                **memory_options(engine_lib, True),
            )
            # Then they complete (or revert) as on a single-library fleet
            for key, value in EXPECTED[kind].items():
                assert outcome[key] == value, (kind, key)
