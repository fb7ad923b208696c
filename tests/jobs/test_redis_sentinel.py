"""The Redis board through Redis Sentinel (TaskFlow's ``sentinel`` keys), on real servers.

A primary, a replica and three Sentinels (``tests/redis_sentinel.py``) run
for each test, plain or TLS only on every link (client certificates,
TaskFlow's ssl keys and ``sentinel_kwargs``). Given TaskFlow's keys as
Octavia passes them (``host``/``port`` of one Sentinel, ``sentinel``,
``sentinel_fallbacks``), a board finds the master through the Sentinels;
when the master is killed -9 mid-run, the Sentinels promote the replica and
the board, its conductor and its waiters carry on against the new master.

What Redis' asynchronous replication can lose: a write the master
acknowledged but had not yet sent to the replica when it died. For the
board that is a job posted (lost: it never runs), a claim (the job is listed
again and re-claimed: the conductor that held it learns at its next lease
renewal that it lost it, and the flow resumes from its persistence), or a
consume (the job comes back claimed and runs again once its lease runs
out). The failover test does not hide this: it counts the runs of every job
and accepts a second run of the jobs in flight at the kill (at most two: the
conductor has two workers), printing which; it fails if a job never
finishes. Its jobs are all posted well before the kill (the replica is
milliseconds behind at most), so none may be lost.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
import uuid

import futurist
import pytest

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.conductors import backends as conductors
from flowengine.jobs import backends
from flowengine.persistence.backends import impl_memory
from flowengine.utils import persistence_utils as pu
from tests.jobs import failover_flows

pytestmark = [pytest.mark.broker]

#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 60.0
#: Jobs on the board when the master dies (the gated one included).
JOBS = 12
#: Jobs finished before the kill: the conductor is well into its work.
DONE_BEFORE_KILL = 3
#: Between two tries of a board operation while the master is down.
RETRY_PAUSE_S = 0.05


@pytest.fixture(params=["plain", "tls"])
def cluster(request):
    """A primary, a replica and three Sentinels: plain, or TLS only with client certificates."""
    return request.getfixturevalue(
        "sentinel_cluster" if request.param == "plain" else "tls_sentinel_cluster"
    )


def _board(cluster, name: str, namespace: str, persistence=None, **extra):
    board = backends.fetch(
        name, cluster.board_conf(namespace=namespace, **extra), persistence=persistence
    )
    board.connect()
    return board


def test_a_board_finds_the_master_through_the_fallback_sentinels(sentinel_cluster):
    # Given TaskFlow's keys whose host/port name a Sentinel that is not
    # running, the three real ones being sentinel_fallbacks
    cluster = sentinel_cluster
    namespace = f"t{uuid.uuid4().hex[:8]}"
    with contextlib.closing(socket_without_server()) as dead:
        conf = cluster.board_conf(
            namespace=namespace,
            port=dead.getsockname()[1],
            sentinel_fallbacks=[f"127.0.0.1:{p}" for p in cluster.sentinel_ports],
        )
        poster = backends.fetch("poster", conf)
        poster.connect()
        worker = _board(cluster, "worker", namespace)
        try:
            # When one board posts and another claims and consumes
            job = poster.post("through-sentinel", details={"n": 1})
            worker.claim(job, "me")
            worker.consume(job, "me")
            outcome = poster.wait_for_outcome(job.uuid, WAIT_S)
            # Then the outcome is seen, and the data lives on the master
            assert outcome is not None and outcome.outcome == "succeeded"
            with contextlib.closing(cluster.client(cluster.primary.port)) as master:
                assert master.exists(f"{namespace}:outcome:{job.uuid}")
                assert master.info("replication")["role"] == "master"
            # And a board closed and connected again reaches it anew
            poster.close()
            poster.connect()
            assert poster.job_count == 0
        finally:
            poster.close()
            worker.close()


def socket_without_server():
    """A bound, not listening, TCP socket: its port refuses connections while it is open."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def _post(board, persistence, factory, label: str):
    lb, fd = pu.temporary_flow_detail(persistence)
    engines.save_factory_details(fd, factory, [], {}, backend=persistence)
    return board.post(label, lb, details={"flow_uuid": fd.uuid, "store": {"label": label}})


def _first_success(operation, deadline: float) -> float:
    """Try ``operation`` until it succeeds; returns when it did (monotonic)."""
    while True:
        try:
            operation()
            return time.monotonic()
        except exc.BoardUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_PAUSE_S)


def test_a_conductor_finishes_every_job_across_a_master_failover(cluster):
    # Given a conductor (two workers) on a board that reaches the master
    # through the Sentinels (with TLS: TaskFlow's ssl keys and sentinel_kwargs),
    # JOBS jobs posted, one of which holds a worker at a gate, and the other
    # worker done with a few of the rest
    failover_flows.reset()
    namespace = f"t{uuid.uuid4().hex[:8]}"
    persistence = impl_memory.MemoryBackend()
    poster = _board(cluster, "poster", namespace, persistence=persistence)
    probe = _board(cluster, "probe", namespace)
    conductor_board = backends.fetch(
        "conductor", cluster.board_conf(namespace=namespace), persistence=persistence
    )
    conductor = conductors.fetch(
        "nonblocking",
        "sentinel-test",
        conductor_board,
        persistence=persistence,
        executor_factory=lambda: futurist.ThreadPoolExecutor(max_workers=2),
    )
    conductor.connect()
    runner = threading.Thread(target=conductor.run, daemon=True)
    try:
        jobs = [_post(poster, persistence, failover_flows.gated_factory, "gated")]
        runner.start()
        assert failover_flows.AT_GATE.wait(WAIT_S)
        jobs += [
            _post(poster, persistence, failover_flows.counted_factory, f"j{i}")
            for i in range(1, JOBS)
        ]
        for job in jobs[1 : 1 + DONE_BEFORE_KILL]:
            assert poster.wait_for_outcome(job.uuid, WAIT_S) is not None
        old_port = cluster.master_port()
        # When the master is killed -9 while the conductor is at work
        done_at_kill = sum(failover_flows.RUNS.values())
        killed_at = cluster.kill_master()
        first_op_at = _first_success(lambda: probe.job_count, killed_at + WAIT_S)
        new_port = cluster.wait_for_new_master(old_port)
        named_at = time.monotonic()
        failover_flows.GATE.set()
        # Then every job finishes, on the new master
        outcomes = {job.uuid: poster.wait_for_outcome(job.uuid, WAIT_S) for job in jobs}
        all_done_at = time.monotonic()
        assert new_port != old_port
        assert new_port in (cluster.primary.port, cluster.replica.port)
        assert all(o is not None and o.outcome == "succeeded" for o in outcomes.values()), outcomes
        runs = dict(failover_flows.RUNS)
        assert set(runs) == {"gated", *(f"j{i}" for i in range(1, JOBS))}, runs
        rerun = sorted(label for label, n in runs.items() if n > 1)
        # A second run can only come from a write the dead master did not
        # replicate (see the module docstring): jobs in flight at the kill.
        assert len(rerun) <= 2, runs
        kind = "tls" if cluster.tls else "plain"
        sys.stderr.write(
            f"\n[failover {kind}] board operation OK {first_op_at - killed_at:.2f} s after"
            f" kill -9;"
            f" all Sentinels name the new master by {named_at - killed_at:.2f} s; all"
            f" {JOBS} jobs ({done_at_kill} done at the kill) done"
            f" {all_done_at - killed_at:.2f} s after the kill; run twice: {rerun or 'none'}\n"
        )
    finally:
        failover_flows.GATE.set()
        conductor.stop()
        conductor.wait(WAIT_S)
        runner.join(WAIT_S)
        conductor.close()
        poster.close()
        probe.close()
