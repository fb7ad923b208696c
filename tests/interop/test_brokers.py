"""Mixed fleets of real worker processes over Redis and RabbitMQ.

Per broker, three worker processes on three exchanges: a TaskFlow worker, a
flowengine worker with ``--compat taskflow`` and a plain flowengine worker.
Each flow runs four ways (engines in this process): TaskFlow and flowengine
(compat) engines on the TaskFlow worker, a TaskFlow engine on the compat
flowengine worker, and an all-flowengine run on the plain one. Every way
must give the all-TaskFlow outcome.
"""

from __future__ import annotations

import time
import uuid

import pytest

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")

from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from tests.interop import harness, processes
from tests.interop import shared_tasks as st
from tests.interop.test_memory import EXPECTED

pytestmark = [pytest.mark.broker, pytest.mark.slow]

TOPIC = "shared"


class Fleet:
    """Exchanges served by one worker process each, on one broker."""

    def __init__(self, url: str, folder: str) -> None:
        self.url = url
        tag = uuid.uuid4().hex[:8]
        self.exchanges = {
            "taskflow": f"interop-tf-{tag}",
            "compat": f"interop-fc-{tag}",
            "flowengine": f"interop-fe-{tag}",
        }
        self.workers = [
            processes.start_taskflow_worker(url, self.exchanges["taskflow"], TOPIC, folder),
            processes.start_flowengine_worker(
                url, self.exchanges["compat"], TOPIC, folder, "taskflow"
            ),
            processes.start_flowengine_worker(
                url, self.exchanges["flowengine"], TOPIC, folder, None
            ),
        ]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + processes.START_TIMEOUT_S
        for worker in self.workers:
            worker.wait_ready(deadline)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {w.library} {w.log_path}\n{w.log_tail()}" for w in self.workers)


@pytest.fixture(scope="module", params=["redis", "amqp"])
def fleet(request, tmp_path_factory):
    url = request.getfixturevalue(f"{request.param}_url")
    fleet = Fleet(url, str(tmp_path_factory.mktemp(f"interop-{request.param}")))
    try:
        fleet.wait_ready()
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(autouse=True)
def _fast_taskflow(monkeypatch):
    from taskflow.engines.worker_based import proxy

    monkeypatch.setattr(proxy, "DRAIN_EVENTS_PERIOD", harness.TASKFLOW_DRAIN_PERIOD_S)


# (engine library, exchange served by the worker, compat for a flowengine engine)
WAYS = {
    "all-taskflow": ("taskflow", "taskflow", None),
    "taskflow-engine-on-flowengine-worker": ("taskflow", "compat", None),
    "flowengine-engine-on-taskflow-worker": ("flowengine", "taskflow", "taskflow"),
    "all-flowengine": ("flowengine", "flowengine", None),
}


def run_way(fleet: Fleet, way: str, kind: str, folder) -> dict:
    engine_lib, served_by, compat = WAYS[way]
    options = {"url": fleet.url, "exchange": fleet.exchanges[served_by], "topics": [TOPIC]}
    if compat:
        options["compat"] = compat
    marker_dir = folder / way
    marker_dir.mkdir()
    return harness.run_flow(engine_lib, kind, st.build(engine_lib), str(marker_dir), **options)


@pytest.mark.parametrize("kind", st.FLOW_KINDS)
def test_same_outcome_on_every_fleet(fleet, kind, tmp_path):
    # Given worker processes of both libraries on a real broker
    # When the same flow runs each way
    outcomes = {way: run_way(fleet, way, kind, tmp_path) for way in WAYS}
    # Then every way gives the all-TaskFlow outcome, which is the expected one
    reference = outcomes["all-taskflow"]
    for way, outcome in outcomes.items():
        assert outcome == reference, f"{way} differs from all-TaskFlow\n{fleet.logs()}"
    for key, value in EXPECTED[kind].items():
        assert reference[key] == value
    expected_state = "REVERTED" if kind == "failing" else "SUCCESS"
    assert set(reference["states"].values()) == {expected_state}
    if kind == "failing":
        assert sorted(reference["markers"]) == [
            "first.executed",
            "first.reverted",
            "second.executed",
            "second.reverted",
        ]
    if kind == "progress":
        assert reference["progress"] == list(st.PROGRESS_STEPS)


def test_discovery_both_ways(fleet):
    from taskflow.engines.worker_based import executor as tf_executor

    from flowengine.engines.worker_based.executor_side import executor as fe_executor

    # Given a TaskFlow executor on the compat flowengine worker's exchange and a
    # flowengine executor (compat) on the TaskFlow worker's exchange
    tf = tf_executor.WorkerTaskExecutor(
        uuid.uuid4().hex, fleet.exchanges["compat"], [TOPIC], url=fleet.url
    )
    fe = fe_executor.WorkerTaskExecutor(
        uuid.uuid4().hex,
        fleet.exchanges["taskflow"],
        [TOPIC],
        broker=BrokerSettings(fleet.url, compat="taskflow"),
    )
    tf.start()
    fe.start()
    try:
        # When each sends NOTIFY
        # Then each learns the other library's worker and its tasks
        assert tf.wait_for_workers(1, timeout=harness.WORKER_START_S) == 0
        tf_tasks = st.build("taskflow")
        for name in st.TASK_NAMES:
            assert tf._finder.get_worker_for_task(getattr(tf_tasks, name)()) is not None
        assert fe.wait_for_workers(1, timeout=harness.WORKER_START_S) == 0
        [worker] = fe.finder.workers
        assert worker.worker_id is None
        assert sorted(worker.tasks) == sorted(f"{st.__name__}.{n}" for n in st.TASK_NAMES)
    finally:
        tf.stop()
        fe.stop()
