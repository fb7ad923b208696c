"""Fault tests: warm and cold shutdown of a worker in the middle of a flow.

Two real ``flowengine worker`` processes share a topic; a flow of gated
tasks (each waits for the test's release file) runs on them; worker A is
signalled while it runs some of them. The checker then counts every request:
done once, duplicated (its body completed more than once) or lost (no
result). Synchronisation is by files: the ledger the tasks write, the
worker's log, the release file.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.patterns import unordered_flow as uf
from tests.reliability import lifecycle_tasks as lt
from tests.reliability import worker_procs as wp

TOPIC = "shutdown"

#: Tasks in the flow: more than the two workers run at once (2 threads each).
TASKS = 8

CASES = [
    pytest.param("filesystem", "threads", id="filesystem-threads"),
    pytest.param("filesystem", "process", id="filesystem-process"),
    pytest.param("redis", "threads", id="redis-threads", marks=pytest.mark.broker),
]


def _worker_of(event: dict, worker_pids: set[int]) -> int:
    """The worker process an event happened in (a forked child reports its parent)."""
    return event["pid"] if event["pid"] in worker_pids else event["ppid"]


def _count(folder: str, names: list[str], results: dict[str, str]) -> dict[str, list[str]]:
    """Checker: each request done once, duplicated, or lost."""
    ends: dict[str, int] = {}
    for e in lt.read_ledger(folder):
        if e["event"] == "end":
            ends[e["task"]] = ends.get(e["task"], 0) + 1
    verdict: dict[str, list[str]] = {"done once": [], "duplicated": [], "lost": []}
    for name in names:
        if results.get(name) != name:
            verdict["lost"].append(name)
        elif ends.get(name, 0) > 1:
            verdict["duplicated"].append(name)
        elif ends.get(name, 0) == 1:
            verdict["done once"].append(name)
        else:
            verdict["lost"].append(name)  # a result nobody computed
    return verdict


class _FlowRun:
    """The flow of gated tasks, run by an engine in a thread."""

    def __init__(self, exchange: str, conn: dict, folder: str) -> None:
        self.names = [f"gated-{i}" for i in range(TASKS)]
        self.executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, [TOPIC], **conn)
        flow = uf.Flow("shutdown-flow").add(*[lt.Gated(name) for name in self.names])
        self.engine = engines.load(
            flow, engine="worker-based", executor=self.executor, store={"folder": folder}
        )
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.engine.run()
        except BaseException as e:  # reported by the test
            self.errors.append(e)

    def why(self, procs: list[wp.WorkerProc]) -> str:
        """The flow's errors (each wrapped failure) and the workers' logs."""
        parts = []
        for error in self.errors:
            causes = getattr(error, "_causes", [])
            parts.extend(f"{f.exception_str}\n{f.traceback_str}" for f in causes)
            parts.append(repr(error))
        parts.extend(f"--- {p.log_path} ---\n{p.log()}" for p in procs)
        return "\n".join(parts)

    def results(self) -> dict[str, str]:
        """What the flow's storage holds for each task (missing ones left out)."""
        found = {}
        for name in self.names:
            try:
                found[name] = self.engine.storage.get_execute_result(name)
            except exc.NotFound:
                pass
        return found


def _start(exchange: str, conn: dict, folder: str, procs: list[wp.WorkerProc]) -> _FlowRun:
    run = _FlowRun(exchange, conn, folder)
    run.executor.start()
    assert run.executor.wait_for_workers(len(procs), wp.WAIT_S) == 0, procs[0].log()
    run.thread.start()
    return run


def _started_on(folder: str, pid: int, pids: set[int]) -> list[str]:
    return [
        e["task"]
        for e in lt.read_ledger(folder)
        if e["event"] == "start" and _worker_of(e, pids) == pid
    ]


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
@pytest.mark.parametrize("kind,executor", CASES)
def test_warm_shutdown_mid_flow_finishes_what_runs_and_exits_0(kind, executor, tmp_path, request):
    folder = str(tmp_path)
    conn = wp.conn_for(kind, tmp_path, request)
    exchange = wp.unique()
    with wp.workers(2, exchange, TOPIC, folder, conn, extra=("--executor", executor)) as procs:
        a, b = procs
        pids = {a.pid, b.pid}
        run = _start(exchange, conn, folder, procs)
        try:
            # Given worker A in the middle of some of the flow's tasks
            on_a = wp.wait_until(lambda: _started_on(folder, a.pid, pids), what="a task on A")
            # When A gets SIGTERM (warm shutdown) and then the tasks are released
            a.signal(signal.SIGTERM)
            a.wait_log("Warm shutdown: no new requests")
            open(os.path.join(folder, "release"), "w").close()
            # Then A finishes them, answers and exits 0; the flow completes on B
            assert a.wait() == 0, a.log()
            run.thread.join(wp.WAIT_S)
            assert not run.thread.is_alive() and not run.errors, run.why(procs)
            results = run.results()
        finally:
            run.executor.stop()
        assert b.proc.poll() is None
    assert "Warm shutdown complete" in a.log()
    # No request was declared lost: A kept its heartbeats going while it finished.
    assert list(run.executor.lost_history) == []
    ended_on_a = [
        e["task"]
        for e in lt.read_ledger(folder)
        if e["event"] == "end" and _worker_of(e, pids) == a.pid
    ]
    assert set(on_a) <= set(ended_on_a), "A gave up a task instead of finishing it"
    verdict = _count(folder, run.names, results)
    assert verdict == {"done once": run.names, "duplicated": [], "lost": []}, verdict


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
@pytest.mark.parametrize("kind,executor", CASES)
def test_cold_shutdown_mid_flow_gives_requests_back_and_the_flow_completes(
    kind, executor, tmp_path, request
):
    folder = str(tmp_path)
    conn = wp.conn_for(kind, tmp_path, request)
    exchange = wp.unique()
    with wp.workers(2, exchange, TOPIC, folder, conn, extra=("--executor", executor)) as procs:
        a, b = procs
        pids = {a.pid, b.pid}
        run = _start(exchange, conn, folder, procs)
        try:
            # Given worker A in the middle of some of the flow's tasks
            on_a = wp.wait_until(lambda: _started_on(folder, a.pid, pids), what="a task on A")
            # When A gets SIGTERM, then SIGINT during its warm shutdown (cold)
            a.signal(signal.SIGTERM)
            a.wait_log("Warm shutdown: no new requests")
            a.signal(signal.SIGINT)
            # Then A exits at once (1), before any gated task could finish
            assert a.wait() == 1, a.log()
            assert "Cold shutdown: gave back" in a.log()
            open(os.path.join(folder, "release"), "w").close()
            # And the flow completes on B
            run.thread.join(wp.WAIT_S)
            assert not run.thread.is_alive() and not run.errors, run.why(procs)
            results = run.results()
        finally:
            run.executor.stop()
    events = lt.read_ledger(folder)
    ended_on_a = [e["task"] for e in events if e["event"] == "end" and _worker_of(e, pids) == a.pid]
    assert ended_on_a == [], "a body on A went on after the cold shutdown"
    rerun_on_b = {
        e["task"] for e in events if e["event"] == "start" and _worker_of(e, pids) == b.pid
    }
    assert set(on_a) <= rerun_on_b, "a request A gave back was not run again on B"
    # Re-dispatched because A gave them back, not because their heartbeats stopped.
    assert list(run.executor.lost_history) == []
    verdict = _count(folder, run.names, results)
    assert verdict == {"done once": run.names, "duplicated": [], "lost": []}, verdict


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_stopping_an_idle_worker_is_not_a_warning(tmp_path, request):
    conn = wp.conn_for("filesystem", tmp_path, request)
    with wp.workers(1, wp.unique(), TOPIC, str(tmp_path), conn) as (worker,):
        worker.wait_log("serves topic")
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()
    log = worker.log()
    assert "Warm shutdown: no new requests, none running" in log
    assert " WARNING " not in log, log


def test_the_same_signal_twice_at_once_counts_once_another_one_means_cold():
    from flowengine.engines.worker_based.worker_side import shutdown

    stopper = shutdown.Shutdown(worker=None)
    # Given a SIGTERM delivered to the process and to its group at once
    stopper.request(signal.SIGTERM)
    stopper.request(signal.SIGTERM)
    # Then it is one (warm) request
    assert stopper.requests == 1
    # When another signal comes (a Ctrl+C)
    stopper.request(signal.SIGINT)
    # Then a cold shutdown is asked for
    assert stopper.requests == 2


def test_the_shutdown_machine_is_frozen_and_says_every_move():
    from automaton import exceptions as automaton_exc

    from flowengine.engines.worker_based.worker_side import shutdown

    assert set(shutdown.TRANSITIONS.items()) == {
        ((shutdown.SERVING, "on_warm"), shutdown.WARM),
        ((shutdown.WARM, "on_stopped"), shutdown.STOPPED),
        ((shutdown.WARM, "on_cold"), shutdown.COLD),
        ((shutdown.COLD, "on_stopped"), shutdown.STOPPED),
    }
    with pytest.raises(automaton_exc.FrozenMachine):
        shutdown.MACHINE.add_state("paused")


def test_a_cold_shutdown_before_the_warm_one_is_refused_naming_both_states():
    from flowengine.engines.worker_based.worker_side import shutdown

    # Given a worker still serving (no worker needed: the move is refused first)
    stopper = shutdown.Shutdown(worker=None)
    # When asked to stop cold at once, then it refuses and stays where it is
    with pytest.raises(exc.InvalidState, match="from serving to cold"):
        stopper.cold()
    assert stopper.state == shutdown.SERVING
