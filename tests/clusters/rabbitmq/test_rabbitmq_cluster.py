"""Quorum queues and failover on a real 3-node RabbitMQ cluster (one per module).

The declaration tests come first; the fault test, which kills a node, last.
"""

from __future__ import annotations

import threading
import time

import pytest

from flowengine import engines, exceptions, states
from flowengine.engines.worker_based.events.receiver import EventReceiver
from flowengine.engines.worker_based.messaging import proxy as proxy_mod
from flowengine.engines.worker_based.messaging.control_client import ControlClient
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import names
from flowengine.patterns import unordered_flow as uf
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import HEARTBEAT_S, MISSES, Conn, Workers

#: Bound on each test, the module fixture's start included: three Erlang nodes
#: started and joined one after another took 12 s on an idle machine and
#: over 120 s (CI's default bound) on a loaded 2-core one.
TEST_TIMEOUT_S = 300

pytestmark = [
    pytest.mark.xdist_group("rabbitmq_cluster"),
    pytest.mark.broker,
    pytest.mark.timeout(TEST_TIMEOUT_S),
]

#: The fault test: tasks in the flow, worker processes, seconds each body works
#: (long enough that the kill lands while a third of the flow is still to run).
TASKS = 100
WORKERS = 3
TASK_PAUSE_S = 0.25
#: Results before the kill: the node dies mid-run.
KILL_AFTER_RESULTS = 30
#: Transition timeout (s): far above a failover (seconds), short enough that a
#: request lost anyway ends the test with RequestTimeout instead of hanging it.
TRANSITION_TIMEOUT_S = 40.0
#: Bounded waits (s), only so that a broken setup fails instead of hanging.
RUN_TIMEOUT_S = 90.0
WAIT_S = 30.0
POLL_S = 0.02


class QuorumConn(Conn):
    """The harness's connection, plus the durable topology with quorum queues."""

    extra: tuple[str, ...] = ()

    def cli_args(self) -> list[str]:
        return [*super().cli_args(), "--durable", "--queue-type", "quorum", *self.extra]

    def kwargs(self) -> dict:
        return {**super().kwargs(), "durable": True, "queue_type": "quorum"}


def _wait(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_S)


def _ends(records: str) -> int:
    return sum(1 for r in checker.read_records(records) if r["ev"] == "end")


def test_quorum_queues_are_declared_on_the_cluster(rabbit_cluster, unique_name, tmp_path):
    # Given a worker with --durable --queue-type quorum on the cluster
    conn = QuorumConn("amqp", url=rabbit_cluster.failover_url)
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(conn, unique_name, "q", str(tmp_path / "records.jsonl"), str(logs))
    try:
        workers.start()
        topic_queue = names.topic_queue_name(unique_name, "q")
        # Then its topic queue is a quorum queue with a leader on a cluster node
        _wait(
            lambda: rabbit_cluster.queue_type(topic_queue) is not None,
            "the topic queue",
            timeout_s=60.0,
        )
        assert rabbit_cluster.queue_type(topic_queue) == "quorum"
        assert rabbit_cluster.queue_leader(topic_queue) in (0, 1, 2)
        # ...and so is its private queue (every durable queue of the topology)
        listed = rabbit_cluster.ctl(
            0, "list_queues", "--quiet", "--no-table-headers", "name", "type"
        )
        mine = [line.split() for line in listed.splitlines() if unique_name in line]
        assert len(mine) >= 3, listed  # topic, private, control
        assert {kind for _name, kind in mine} == {"quorum"}, mine
    finally:
        workers.stop_all()


def test_classic_and_quorum_declarations_conflict_with_one_clear_error(rabbit_cluster, unique_name):
    # Given a topic queue a process declared classic (durable)...
    classic = BrokerSettings(rabbit_cluster.urls[0], durable=True)
    quorum = BrokerSettings(rabbit_cluster.urls[1], durable=True, queue_type="quorum")
    first = proxy_mod.Proxy("t", unique_name, broker=classic)
    thread = threading.Thread(target=first.start, daemon=True)
    thread.start()
    try:
        assert first.wait_started(WAIT_S, WAIT_S) is None
        # When another process declares it as a quorum queue
        second = proxy_mod.Proxy("t", unique_name, broker=quorum)
        other = threading.Thread(target=second.start, daemon=True)
        other.start()
        try:
            problem = second.wait_started(WAIT_S, WAIT_S)
        finally:
            second.stop()
            other.join(WAIT_S)
    finally:
        first.stop()
        thread.join(WAIT_S)
    # Then it fails at once with one line naming the queue and the option
    assert isinstance(problem, exceptions.BrokerConfigError), problem
    text = str(problem)
    print(f"\n[rabbitmq cluster] classic vs quorum: {text}")
    assert "\n" not in text
    assert repr(names.topic_queue_name(unique_name, "t")) in text, text
    assert "queue_type='quorum'" in text, text
    assert "guest:guest" not in text


def test_quorum_needs_the_durable_topology_and_amqp():
    with pytest.raises(ValueError, match="durable"):
        BrokerSettings("amqp://127.0.0.1//", queue_type="quorum")
    with pytest.raises(ValueError, match="RabbitMQ"):
        BrokerSettings("redis://127.0.0.1:6379/0", durable=True, queue_type="quorum")
    with pytest.raises(ValueError, match="queue_type"):
        BrokerSettings("amqp://127.0.0.1//", durable=True, queue_type="stream")
    assert (
        BrokerSettings.from_options(
            {"url": "amqp://h1//;amqp://h2//", "durable": True, "queue_type": "quorum"}
        ).queue_type
        == "quorum"
    )


@pytest.mark.slow
def test_kill9_of_the_queue_leader_node_mid_flow(rabbit_cluster, unique_name, tmp_path):
    # Given 3 worker processes and an engine on the cluster (failover URL list,
    # durable topology, quorum queues), an event stream and a control client
    conn = QuorumConn("amqp", url=rabbit_cluster.failover_url)
    conn.extra = ("--events",)
    records = str(tmp_path / "records.jsonl")
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(conn, unique_name, "fault", records, str(logs))
    names_ = [f"s{i}" for i in range(TASKS)]
    flow = uf.Flow("cluster").add(
        *[
            fault_tasks.Step(name, provides=f"r{i}", inject={"n": i, "pause": TASK_PAUSE_S})
            for i, name in enumerate(names_)
        ]
    )
    engine = engines.load(
        flow,
        engine="worker-based",
        exchange=unique_name,
        topics=["fault"],
        transition_timeout=TRANSITION_TIMEOUT_S,
        heartbeat_misses=MISSES,
        events=True,
        **conn.kwargs(),
    )
    results: list[float] = []  # monotonic time of each task's SUCCESS seen by the engine

    def on_atom(state: str, details: dict) -> None:
        if state == states.SUCCESS:
            results.append(time.monotonic())

    engine.atom_notifier.register("*", on_atom)
    events: list[tuple[float, str]] = []
    receiver = EventReceiver(
        unique_name,
        lambda event: events.append((time.monotonic(), event["type"])),
        broker=BrokerSettings(rabbit_cluster.failover_url),
    )
    receiving = threading.Thread(target=receiver.run, daemon=True)
    broker = BrokerSettings(rabbit_cluster.failover_url, durable=True, queue_type="quorum")
    outcome: list[BaseException] = []
    killed: dict[str, float] = {}
    try:
        receiving.start()
        assert receiver.wait_ready(WAIT_S)
        for _ in range(WORKERS):
            workers.start()
        topic_queue = names.topic_queue_name(unique_name, "fault")
        _wait(
            lambda: rabbit_cluster.queue_leader(topic_queue) is not None,
            "the topic queue's leader",
            timeout_s=60.0,
        )
        leader = rabbit_cluster.queue_leader(topic_queue)
        with ControlClient(unique_name, broker) as control:
            _wait(
                lambda: len(control.ask("ping", timeout_s=1.0)) == WORKERS,
                "every worker to answer a ping",
            )

        def run() -> None:
            try:
                engine.run()
            except BaseException as e:  # examined below
                outcome.append(e)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        # When the node holding the topic queue's leader is killed with SIGKILL
        # once a third of the flow is done
        _wait(
            lambda: _ends(records) >= KILL_AFTER_RESULTS or not runner.is_alive(),
            "results before the kill",
            timeout_s=RUN_TIMEOUT_S,
        )
        assert runner.is_alive(), f"the flow ended before the kill: {outcome}"
        killed["wall"] = time.time()
        killed["mono"] = rabbit_cluster.kill(leader)
        results_before = len(results)
        runner.join(RUN_TIMEOUT_S)
        assert not runner.is_alive(), "flow did not finish\n" + workers.logs()
        # ...the control client reaches every worker through a surviving node
        with ControlClient(unique_name, broker) as control:
            _wait(
                lambda: len(control.ask("ping", timeout_s=1.0)) == WORKERS,
                "every worker to answer a ping after the failover",
            )
    finally:
        workers.stop_all()
        receiver.stop()
        receiving.join(WAIT_S)

    # Then the flow finished with every result
    assert not outcome, outcome
    assert engine.storage.get_flow_state() == states.SUCCESS, workers.logs()
    assert [engine.storage.fetch(f"r{i}") for i in range(TASKS)] == list(range(TASKS))
    # ...every task body ran once, or again only after the first run ended:
    # never lost, never two at once
    report = checker.check(checker.read_records(records), names_)
    new_results = [t for t in results[results_before:] if t > killed["mono"]]
    assert new_results, "no result after the kill"
    failover_s = new_results[0] - killed["mono"]
    print(
        f"\n[rabbitmq cluster] kill -9 of node {leader} (the topic queue's leader)"
        f" after {results_before} results: {report.summary()}; sequential re-runs"
        f" {len(report.duplicated)}; first new result {failover_s:.2f} s after the kill;"
        f" heartbeat {HEARTBEAT_S} s x {MISSES}"
    )
    assert report.lost == [], report.summary()
    assert report.concurrent == [], report.summary()
    assert len(report.done_once) + len(report.duplicated) == TASKS
    assert leader not in rabbit_cluster.alive_nodes()
    # ...and the event stream went on through a surviving node
    after = {kind for t, kind in events if t > killed["mono"]}
    assert "flow-finished" in after, after  # the engine's, published after the failover
    assert "task-succeeded" in after, after  # the workers' own
