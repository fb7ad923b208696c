"""The Redis transport through Sentinel: a 100-task flow rides out kill -9 of the master.

Given 3 ``flowengine worker`` processes (with ``--events``) and an engine
that reach Redis through its Sentinels (``sentinel://`` URLs, kombu's
spelling): when the master is killed -9 with 30 task bodies done, the
Sentinels promote the replica and every client finds it (consumers resume).
Then the flow succeeds, every task body completed exactly once or, re-run
after its worker was cut off, one after the other (never two at once), and
none is lost; ``flowengine inspect`` finds the three workers and
``flowengine events`` follows a new flow, both on the new master.

Publications and acceptances wait for the replica (WAIT, see
flowengine/utils/redis_replicas.py), so the failover cannot take away a
request (never seen by a worker) or a worker's taking of one (run twice at
once).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from flowengine import engines, states
from flowengine.patterns import unordered_flow as uf
from tests import proc_utils
from tests.clusters.redis.conftest import restore, transport_conn
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import HEARTBEAT_S, MISSES, ROOT, env

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("redis_sentinel")]

TASKS = 100
WORKERS = 3
#: Each body's work (s): with 6 threads the flow takes ~4 s without a fault.
PAUSE_S = 0.2
#: Bodies completed when the master is killed.
DONE_AT_KILL = 30
#: Far above a failover (a few s), short enough that a lost request fails soon.
TRANSITION_TIMEOUT_S = 45.0
#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 90.0
POLL_S = 0.02


def _worker(conn, exchange: str, records: str, log_dir: str, n: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "worker",
        "--exchange",
        exchange,
        "--topic",
        "fault",
        "--threads",
        "2",
        "--heartbeat-interval",
        str(HEARTBEAT_S),
        "--tasks",
        "tests.reliability.fault_tasks",
        "--events",
        *conn.cli_args(),
    ]
    with open(os.path.join(log_dir, f"worker-{n}.log"), "wb") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env(records), cwd=ROOT
        )


def _events(conn, exchange: str, records: str) -> tuple[subprocess.Popen, queue.Queue]:
    """``flowengine events --json`` consuming (its "Listening" line read), and its lines."""
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "events",
        "--json",
        "--exchange",
        exchange,
        *conn.cli_args(),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(records), cwd=ROOT
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(x) for x in iter(proc.stdout.readline, "")], daemon=True
    ).start()
    assert "Listening for events" in proc.stderr.readline()
    return proc, lines


def _logs(log_dir: str) -> str:
    out = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name), errors="replace") as f:
            out.append(f"--- {name}\n{f.read()[-3000:]}")
    return "\n".join(out)


def _wait_done(records: str, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while sum(1 for r in checker.read_records(records) if r["ev"] == "end") < count:
        assert time.monotonic() < deadline, f"fewer than {count} task bodies done"
        time.sleep(POLL_S)


def _succeeded(lines: queue.Queue, count: int) -> list[str]:
    """Names of the first ``count`` task-succeeded events among ``lines`` (bounded wait)."""
    names: list[str] = []
    while len(names) < count:
        event = json.loads(lines.get(timeout=WAIT_S))  # queue.Empty fails the test
        if event.get("type") == "task-succeeded":
            names.append(event["name"])
    return names


def test_a_flow_finishes_across_a_master_failover_without_loss_or_overlap(
    cluster, tmp_path, unique_name
):
    # Given 3 workers, an events follower and a 100-task flow, all through the Sentinels
    conn = transport_conn(cluster)
    records, log_dir = str(tmp_path / "records.jsonl"), str(tmp_path / "logs")
    os.mkdir(log_dir)
    names = [f"s{i}" for i in range(TASKS)]
    after_names = [f"after{i}" for i in range(3)]
    flow = uf.Flow("failover").add(
        *[
            fault_tasks.Work(name, provides=f"r{i}", inject={"n": i, "pause": PAUSE_S})
            for i, name in enumerate(names)
        ]
    )
    engine = engines.load(
        flow,
        engine="worker-based",
        exchange=unique_name,
        topics=["fault"],
        transition_timeout=TRANSITION_TIMEOUT_S,
        heartbeat_misses=MISSES,
        **conn.kwargs(),
    )
    results_at: list[float] = []  # when the engine took in each task's result
    engine.atom_notifier.register(
        states.SUCCESS, lambda state, details: results_at.append(time.monotonic())
    )
    workers = [_worker(conn, unique_name, records, log_dir, n) for n in range(WORKERS)]
    follower = None
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            engine.run()
        except BaseException as e:  # examined below
            outcome.append(e)

    runner = threading.Thread(target=run, daemon=True)
    killed = None
    try:
        runner.start()
        _wait_done(records, DONE_AT_KILL)
        # When the master is killed -9 mid-run
        old_port = cluster.master_port()
        killed = next(s for s in cluster.servers() if s.port == old_port)
        killed_at = cluster.kill_master()
        new_port = cluster.wait_for_new_master(old_port)
        failover_s = time.monotonic() - killed_at
        runner.join(WAIT_S)
        flow_done_s = time.monotonic() - killed_at
        assert not runner.is_alive(), "flow did not finish\n" + _logs(log_dir)
        # Then the control client finds the three workers on the new master
        ping = subprocess.run(
            [
                sys.executable,
                "-m",
                "flowengine",
                "inspect",
                "ping",
                "--json",
                "--exchange",
                unique_name,
                "--limit",
                str(WORKERS),
                "--timeout",
                "10",
                *conn.cli_args(),
            ],
            capture_output=True,
            text=True,
            env=env(records),
            cwd=ROOT,
            timeout=WAIT_S,
        )
        # ...and the event stream reaches `flowengine events` through it
        follower, event_lines = _events(conn, unique_name, records)
        after = uf.Flow("after").add(
            *[
                fault_tasks.Step(f"after{i}", provides=f"a{i}", inject={"n": i, "pause": 0.0})
                for i in range(3)
            ]
        )
        engines.run(
            after,
            engine="worker-based",
            exchange=unique_name,
            topics=["fault"],
            transition_timeout=TRANSITION_TIMEOUT_S,
            **conn.kwargs(),
        )
        seen_events = _succeeded(event_lines, 3)
    finally:
        proc_utils.stop_processes([*workers, *([follower] if follower else [])], 15.0)
        if killed is not None:
            restore(cluster, killed)  # the module's next test has a replica again
    assert new_port != old_port
    assert not outcome, outcome
    assert engine.storage.get_flow_state() == states.SUCCESS, _logs(log_dir)
    assert [engine.storage.fetch(f"r{i}") for i in range(TASKS)] == list(range(TASKS))
    assert ping.returncode == 0, ping.stderr
    assert len(json.loads(ping.stdout)) == WORKERS, ping.stdout
    assert sorted(seen_events) == ["after0", "after1", "after2"], seen_events
    run_records = checker.read_records(records)
    report = checker.check([r for r in run_records if r["name"] not in after_names], names)
    # The first result the engine took in once the Sentinels had named the new master.
    new_results = [t - killed_at for t in results_at if t - killed_at >= failover_s]
    first_new_s = min(new_results, default=None)
    lost_and_sent_again = len(engine._task_executor.lost_history)
    sys.stderr.write(
        f"\n[redis sentinel transport] {report.summary()}; sequential re-runs"
        f" {len(report.duplicated)}; requests re-dispatched {lost_and_sent_again};"
        f" Sentinels named the new master {failover_s:.2f} s after kill -9; first result"
        f" through it {first_new_s if first_new_s is None else round(first_new_s, 2)} s after"
        f" the kill; flow done {flow_done_s:.2f} s after it\n"
    )
    # Never two runs of one request at once, none lost
    assert report.concurrent == [], report.summary()
    assert report.lost == [], report.summary()
    assert len(report.done_once) + len(report.duplicated) == TASKS
    assert first_new_s is not None
