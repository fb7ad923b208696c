"""The event stream: publisher, receiver, and the events real workers and engines send."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from flowengine import engines, exceptions, retry
from flowengine.engines.worker_based import events as ev
from flowengine.engines.worker_based.events import hooks as event_hooks
from flowengine.engines.worker_based.events import receiver
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.worker_side.worker_events import EventsMiddleware
from flowengine.patterns import linear_flow
from tests.worker_based import event_tasks
from tests.worker_based.event_helpers import (
    WAIT_S,
    brief,
    check_sequences,
    collecting,
    flow_and_requests_finished,
    flow_finished,
)
from tests.worker_based.executor_helpers import MEMORY, running_worker, unique
from tests.worker_based.test_cli import _env


def _linear(n: int) -> linear_flow.Flow:
    flow = linear_flow.Flow("steps")
    for i in range(n):
        flow.add(event_tasks.Step(f"step-{i}", rebind={"value": f"v{i}"}, provides=f"v{i + 1}"))
    return flow


def _run(flow, exchange: str, store: dict, **conn) -> engines.base.Engine:
    engine = engines.load(
        flow,
        store=store,
        engine="worker-based",
        exchange=exchange,
        topics=["t"],
        events=True,
        transition_timeout=WAIT_S,
        **conn,
    )
    engine.run()
    return engine


# --- units -------------------------------------------------------------------


def test_lamport_clock_never_goes_backwards():
    clock = ev.LamportClock()
    assert [clock.forward() for _ in range(3)] == [1, 2, 3]
    assert clock.adjust(10) == 11
    assert clock.adjust(2) == 12  # an older value seen: still forward
    assert clock.forward() == 13


def test_lamport_clock_is_strict_across_threads():
    clock = ev.LamportClock()
    seen: list[int] = []
    lock = threading.Lock()

    def spin() -> None:
        for _ in range(500):
            value = clock.forward()
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=spin) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 2001))


def test_disabled_publisher_sends_nothing_and_starts_no_thread():
    publisher = ev.EventPublisher("x", transport="memory", enabled=False)
    assert publisher.send("task-started", uuid="u") is None
    assert publisher._thread is None
    publisher.close()


def test_full_buffer_drops_and_counts():
    # Given a publisher whose buffer holds one event and whose thread is busy
    publisher = ev.EventPublisher("x", transport="memory", buffer_size=1)
    with publisher._send_lock:  # keep the thread from starting to drain
        publisher._thread = threading.Thread(target=lambda: None)
    # When three events are sent
    results = [publisher.send("task-started", uuid=str(i)) for i in range(3)]
    # Then the first is buffered, the others dropped and counted
    assert results[0] is not None and results[0]["clock"] == 1
    assert results[1:] == [None, None]
    assert publisher.dropped == 2


def test_events_are_off_by_default():
    assert event_hooks.EVENTS_BY_DEFAULT is False
    hooks = EventsMiddleware.create("x", "w", ["t"], [], BrokerSettings(transport="memory"))
    assert hooks.enabled is False


def test_events_carry_standard_fields_and_reach_every_receiver():
    exchange = unique()
    publisher = ev.EventPublisher(exchange, transport="memory", hostname="me")
    with collecting(exchange, **MEMORY) as first, collecting(exchange, **MEMORY) as second:
        sent = publisher.send("worker-online", topic="t")
        assert publisher.flush(WAIT_S)
        for collector in (first, second):
            assert collector.wait_for(lambda events: len(events) == 1)
            event = collector.events[0]
            assert event == json.loads(json.dumps(sent))
            assert set(ev.STANDARD_FIELDS) <= set(event)
            assert event["hostname"] == "me" and event["clock"] == 1
    publisher.close()


# --- real workers, in process (memory transport) ------------------------------


def test_linear_flow_events_in_order_with_no_missing_terminal():
    # Given a worker and an engine with events on, and a receiver listening
    exchange = unique()
    with (
        collecting(exchange, **MEMORY) as seen,
        running_worker(exchange, "t", [event_tasks.Step], events=True, **MEMORY),
    ):
        # When a 5-task linear flow runs
        engine = _run(_linear(5), exchange, {"v0": 0}, **MEMORY)
        assert seen.wait_for(flow_and_requests_finished(5)), brief(seen.events)
    assert engine.storage.fetch("v5") == 5
    # Then each request's events are received -> started -> progress -> succeeded
    count = check_sequences(seen.events)
    assert len(count.done_once) == 5 and not count.duplicated and not count.lost
    for runs in count.runs.values():
        assert runs == [["task-received", "task-started", "task-progress", "task-succeeded"]]
    succeeded = seen.of_type("task-succeeded")
    flow_id = engine.storage.flow_uuid
    for event in succeeded:
        assert event["root_id"] == flow_id and event["attempt"] == 0
        assert event["runtime"] >= 0
        assert event["created"] <= event["enqueued"] <= event["started"] <= event["ended"]
    # each end carries the worker's count so far (one worker: 1, 2, ... 5)
    assert sorted(e["processed"] for e in succeeded) == [1, 2, 3, 4, 5]
    assert [e["type"] for e in seen.of_type("flow-started", "flow-finished")] == [
        "flow-started",
        "flow-finished",
    ]
    assert seen.of_type("flow-finished")[0]["state"] == "SUCCESS"
    assert seen.of_type("worker-online")
    # And the engine's statistics hold each remote atom's timings
    atoms = engine.statistics["atoms"]
    assert sorted(atoms) == [f"step-{i}" for i in range(5)]
    assert all(
        a["attempts"] == 1 and a["queue_time"] >= 0 and a["run_time"] >= 0 for a in atoms.values()
    )


def test_failure_and_retry_events(tmp_path):
    # Given a flow whose retry controller re-runs a task that fails once
    exchange = unique()
    marker = tmp_path / "marker"
    flow = linear_flow.Flow("retried", retry=retry.Times(3, name="again")).add(
        event_tasks.FailOnce("flaky", inject={"marker": str(marker)}, provides="out")
    )
    with (
        collecting(exchange, **MEMORY) as seen,
        running_worker(exchange, "t", [event_tasks.FailOnce], events=True, **MEMORY),
    ):
        # When it runs
        engine = _run(flow, exchange, {}, **MEMORY)
        # (execute failed, revert, execute again)
        assert seen.wait_for(flow_and_requests_finished(3)), brief(seen.events)
    assert engine.storage.fetch("out") == "second attempt"
    # Then the first execution failed, was reverted, retried and succeeded
    count = check_sequences(seen.events)
    assert not count.duplicated and not count.lost
    runs = [
        run[-1]
        for (uuid, action), runs in count.runs.items()
        if action == "execute"
        for run in runs
    ]
    assert runs == ["task-failed", "task-succeeded"]
    assert seen.of_type("task-failed")[0]["exception"]
    assert [e["name"] for e in seen.of_type("task-retried")] == ["again"]
    assert engine.statistics["atoms"]["flaky"]["attempts"] == 2


def test_failed_flow_has_terminal_events_for_execute_and_revert():
    exchange = unique()
    flow = linear_flow.Flow("doomed").add(
        event_tasks.Step("first", provides="v1", rebind={"value": "v0"}), event_tasks.Boom("boom")
    )
    with (
        collecting(exchange, **MEMORY) as seen,
        running_worker(exchange, "t", [event_tasks.Step, event_tasks.Boom], events=True, **MEMORY),
    ):
        with pytest.raises(exceptions.WrappedFailure, match="boom"):
            _run(flow, exchange, {"v0": 1}, **MEMORY)
        assert seen.wait_for(flow_and_requests_finished(4)), brief(seen.events)
    count = check_sequences(seen.events)
    assert not count.duplicated and not count.lost
    # execute of both, revert of both: four requests, each done once
    assert sorted(action for _, action in count.done_once) == [
        "execute",
        "execute",
        "revert",
        "revert",
    ]
    assert seen.of_type("flow-finished")[0]["state"] == "REVERTED"


def test_worker_without_events_sends_none():
    exchange = unique()
    with (
        collecting(exchange, **MEMORY) as seen,
        running_worker(exchange, "t", [event_tasks.Step], **MEMORY),
    ):
        engine = engines.load(
            _linear(2),
            store={"v0": 0},
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            **MEMORY,
        )
        engine.run()
        # A marker event published after the run arrives after anything the
        # run could have sent (same memory transport): nothing else came.
        marker = ev.EventPublisher(exchange, **MEMORY, hostname="marker")
        marker.send("worker-heartbeat")
        assert marker.flush(WAIT_S)
        assert seen.wait_for(lambda events: any(e["hostname"] == "marker" for e in events))
        marker.close()
    assert [e["hostname"] for e in seen.events] == ["marker"]


def test_bad_exchange_event_is_ignored_by_receiver():
    assert list(receiver.decode(b"not json")) == []
    assert list(receiver.decode('[{"type": "a"}, {"no": "type"}]')) == [{"type": "a"}]


# --- real worker processes (filesystem transport) -----------------------------


@pytest.mark.slow
def test_worker_processes_publish_events(tmp_path):
    # Given two `flowengine worker --events` processes on the filesystem transport
    exchange = unique()
    conn = {"transport": "filesystem", "transport_options": {"data_folder": str(tmp_path / "bus")}}
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
        "tests.worker_based.event_tasks",
        "--events",
        "--threads",
        "2",
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={tmp_path / 'bus'}",
    ]
    with collecting(exchange, **conn) as seen:
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
            for _ in range(2)
        ]
        try:
            assert seen.wait_for(
                lambda events: (
                    len({e["hostname"] for e in events if e["type"] == "worker-online"}) == 2
                )
            )
            # When a 10-task flow runs on them
            engine = _run(_linear(10), exchange, {"v0": 0}, **conn)
            assert engine.storage.fetch("v10") == 10
            assert seen.wait_for(flow_finished())
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                assert proc.wait(WAIT_S) == 0
        # Then worker-offline arrives from both
        assert seen.wait_for(lambda events: sum(e["type"] == "worker-offline" for e in events) == 2)
    # And every request is done once, in clock order per sender
    count = check_sequences(seen.events)
    assert len(count.done_once) == 10 and not count.duplicated and not count.lost


def test_remote_statistics_describe_the_latest_run():
    exchange = unique()
    with running_worker(exchange, "t", [event_tasks.Step], **MEMORY):
        engine = engines.load(
            _linear(2),
            store={"v0": 0},
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            **MEMORY,
        )
        engine.run()
        engine.reset()
        engine.run()
    atoms = engine.statistics["atoms"]
    assert {name: a["attempts"] for name, a in atoms.items()} == {"step-0": 1, "step-1": 1}
    assert all(a["dispatches"] == 1 and a["worker_id"] for a in atoms.values())


def test_filesystem_receiver_unbinds_when_it_stops(tmp_path):
    # Given a receiver on the filesystem transport, then stopped
    exchange = unique()
    conn = {"transport": "filesystem", "transport_options": {"data_folder": str(tmp_path)}}
    publisher = ev.EventPublisher(exchange, hostname="p", **conn)
    with collecting(exchange, **conn) as seen:
        publisher.send("worker-online")
        assert seen.wait_for(lambda events: len(events) == 1)
    # When more events are published
    for _ in range(5):
        publisher.send("worker-heartbeat")
    assert publisher.flush(WAIT_S)
    publisher.close()
    # Then no message file piles up for the receiver that left
    leftovers = [p for p in tmp_path.rglob("*.msg")]
    assert leftovers == []


def test_a_flow_on_every_broker_streams_complete_sequences(broker):
    # Given a worker and an engine with events on, over each kind of broker
    exchange = unique()
    conn = {"url": broker.url}
    if broker.transport_options:
        conn["transport_options"] = broker.transport_options
    with (
        collecting(exchange, **conn) as seen,
        running_worker(exchange, "t", [event_tasks.Step], events=True, **conn),
    ):
        # When a 3-task flow runs
        engine = _run(_linear(3), exchange, {"v0": 0}, **conn)
        assert engine.storage.fetch("v3") == 3
        assert seen.wait_for(flow_and_requests_finished(3)), brief(seen.events)
    # Then every request is done once, in clock order per sender
    count = check_sequences(seen.events)
    assert len(count.done_once) == 3 and not count.duplicated and not count.lost


def test_engine_publisher_holds_no_thread_between_runs():
    exchange = unique()
    with (
        collecting(exchange, **MEMORY) as seen,
        running_worker(exchange, "t", [event_tasks.Step], events=True, **MEMORY),
    ):
        engine = _run(_linear(1), exchange, {"v0": 0}, **MEMORY)
        publisher = engine._flow_events.publisher
        assert publisher._thread is None
        engine.reset()
        engine.run()
        assert seen.wait_for(flow_finished(2))
        assert publisher._thread is None
    clocks = [e["clock"] for e in seen.events if e["hostname"] == publisher.hostname]
    assert clocks == sorted(clocks) and len(clocks) == 4  # started/finished twice
