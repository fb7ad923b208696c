"""ZooKeeper boards and persistence on a 3-node ensemble, across a kill -9 of its leader.

Clients name all three nodes (``zookeeper://h1:p1,h2:p2,h3:p3/...``), the
leader first so that their sessions live on the node that dies. ZooKeeper
keeps a session while its client reconnects to any serving node within the
session timeout; the ensemble elects a new leader in about a second. So a
board keeps its session, its claims (ephemeral lease znodes) and its
watches, and nothing written before the kill is lost (a write is
acknowledged only once a quorum has it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from flowengine.jobs import backends
from flowengine.persistence import backends as persistence_backends
from flowengine.persistence import models
from flowengine.persistence.backends import impl_zookeeper
from flowengine.utils import kazoo_utils
from tests import waiting
from tests.conductors import checker, fleet, ledger_flows

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.xdist_group("zookeeper_ensemble")]

#: The boards' lease, so their ZooKeeper session timeout (a board asks for
#: a session as long as its lease): well above an election on loopback
#: (~0.4 s idle, a few seconds on a loaded machine).
LEASE_S = 4.0
#: Jobs of the fault test, and how many are done when the leader dies.
JOBS = 50
DONE_BEFORE_KILL = 15
#: The slow task's sleep: the fleet is at work on several jobs at the kill.
TASK_DELAY_S = 0.2
#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 90.0
#: Bound on every job of the fault test having an outcome, from the kill:
#: they take 2-15 s on a loaded 2-core machine (the election, the sessions
#: moving to surviving nodes, 35 jobs of 0.6 s on 3 conductors). Shorter
#: than WAIT_S so that a stall is reported by the test, naming what it
#: waited for, within CI's 120 s pytest-timeout, not by a stack dump.
ALL_DONE_S = 60.0
#: Lines of each conductor's log a stall report shows, and jobs it names.
LOG_TAIL_LINES = 25
MAX_JOBS_SHOWN = 12


def leader_first(ensemble) -> str:
    """The ensemble's hosts, the leader's first: kazoo connects to the first it can."""
    leader = ensemble.wait_for_leader()
    order = [leader] + [i for i in range(len(ensemble.nodes)) if i != leader]
    return ",".join(f"127.0.0.1:{ensemble.nodes[i].port}" for i in order)


def test_a_board_and_its_persistence_keep_session_and_claims_across_a_leader_loss(ensemble):
    # Given one kazoo client on all three nodes (connected to the leader),
    # shared by a ZooKeeper persistence backend and a board on it, with a
    # logbook saved and a job claimed
    e = ensemble.ensemble
    hosts = leader_first(e)
    namespace = f"t{uuid.uuid4().hex[:10]}"
    client = kazoo_utils.make_client({"hosts": hosts, "timeout": LEASE_S})
    persistence = impl_zookeeper.ZkBackend({"path": f"/flowengine-test/{namespace}"}, client=client)
    board = backends.fetch(
        "survivor",
        {
            "board": "zookeeper",
            "path": "/flowengine-test/jobs",
            "namespace": namespace,
            "lease_s": LEASE_S,
        },
        client=client,
        persistence=persistence,
    )
    try:
        with contextlib.closing(persistence.get_connection()) as conn:
            conn.upgrade()
            book = conn.save_logbook(models.LogBook("before-the-kill"))
        board.connect()
        job = board.post("held", book)
        board.claim(job, "me")
        lost: list = []
        board.on_claim_lost(job, lost.append)
        session = client.client_id
        states: list[str] = []
        client.add_listener(states.append)
        leader_port = client._connection._socket.getpeername()[1]
        assert leader_port == e.nodes[e.leader()].port
        # When the leader is killed -9
        killed, killed_at = e.kill_leader()
        # Then the client reconnects to a surviving node within the session
        # timeout, on the same session
        waiting.wait_until(lambda: "CONNECTED" in states, "the client to reconnect", WAIT_S)
        reconnected_s = time.monotonic() - killed_at
        assert states[0] == "SUSPENDED" and "LOST" not in states, states
        assert client.client_id == session
        assert client._connection._socket.getpeername()[1] != leader_port
        # And the claim is still ours: its lease znode kept, renewed, consumable
        assert board.find_owner(job) == "me"
        assert board.extend_lease(job, LEASE_S)
        board.consume(job, "me")
        assert board.outcome(job).outcome == "succeeded"
        assert lost == []
        # And what was saved before the kill is there, and saving works again
        with contextlib.closing(persistence.get_connection()) as conn:
            assert conn.get_logbook(book.uuid).name == "before-the-kill"
            conn.save_logbook(models.LogBook("after-the-kill"))
        sys.stderr.write(
            f"\n[zookeeper ensemble] leader node {killed + 1} killed; session"
            f" {session[0]:#x} back on another node after {reconnected_s:.2f} s;"
            f" client states {states}\n"
        )
    finally:
        board.close()
        persistence.close()
        kazoo_utils.finalize_client(client)


def _first_consume_after(hosts: str, consumed_path: str, jobs, wall_time: float) -> float:
    """Seconds from ``wall_time`` to the first job consumed after it.

    The ensemble's own commit time: the ``ctime`` of the job's znode in the
    board's ``consumed`` folder (the machine's clock: all nodes run here).
    """
    client = kazoo_utils.make_client({"hosts": hosts})
    client.start(timeout=WAIT_S)
    try:
        times = [client.get(f"{consumed_path}/{job.uuid}")[1].ctime / 1000.0 for job in jobs]
    finally:
        kazoo_utils.finalize_client(client)
    return min(t for t in times if t > wall_time) - wall_time


def _outcomes_within(board, jobs, deadline: float) -> dict:
    """Each job's outcome (None for one that had none by ``deadline``, a monotonic time)."""
    return {
        job.uuid: board.wait_for_outcome(job, max(0.0, deadline - time.monotonic())) for job in jobs
    }


def _stall_report(board, unfinished, conductors: fleet.Fleet, ledger: str) -> str:
    """What the test waited for, and what the board, the ledger and the conductors say of it.

    A conductor holding an unfinished job is sent SIGABRT first: it runs
    with PYTHONFAULTHANDLER, so its log ends with every thread's stack.
    """
    ran = {}
    for record in checker.read(ledger):
        ran.setdefault(record["job"], []).append(f"{record['task']}:{record['ev']}")
    lines = [f"{len(unfinished)} job(s) without an outcome {ALL_DONE_S:g} s after the kill:"]
    holders = set()
    for job in unfinished[:MAX_JOBS_SHOWN]:
        try:
            owner, state = board.find_owner(job), job.state
        except Exception as e:  # the report must not hide the stall behind another error
            owner, state = None, f"unreadable ({type(e).__name__}: {e})"
        holders.add(owner)
        lines.append(
            f"  {job.name} {job.uuid}: {state}, held by {owner}; ledger {ran.get(job.name, [])}"
        )
    if len(unfinished) > MAX_JOBS_SHOWN:
        lines.append(f"  and {len(unfinished) - MAX_JOBS_SHOWN} more")
    for member in conductors.members:
        if member.name in holders and member.alive():
            os.kill(member.pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.proc.wait(fleet.STOP_TIMEOUT_S)
    for member in conductors.members:
        log = member.log()
        tail = log.splitlines()[-LOG_TAIL_LINES:]
        stacks = log.find("Fatal Python error")
        if stacks >= 0:  # a holder's stacks, whole
            tail = log[stacks:].splitlines()
        lines.append(f"--- conductor {member.name} (pid {member.pid}) ---")
        lines.extend(tail)
    return "\n".join(lines)


def test_three_conductors_finish_50_jobs_each_once_across_a_leader_kill(
    ensemble, tmp_path, monkeypatch
):
    # Given three conductor processes whose board and ZooKeeper persistence
    # name the whole ensemble (leader first), and 50 three-task jobs posted
    e = ensemble.ensemble
    hosts = leader_first(e)
    namespace = f"t{uuid.uuid4().hex[:10]}"
    board_url = f"zookeeper://{hosts}/flowengine-test/jobs?namespace={namespace}"
    persistence_url = f"zookeeper://{hosts}/flowengine-test/{namespace}"
    ledger = os.path.join(tmp_path, "ledger.jsonl")
    persistence = persistence_backends.fetch(persistence_url)
    with contextlib.closing(persistence.get_connection()) as conn:
        conn.upgrade()
    board = backends.fetch(
        "poster", {"board": board_url, "lease_s": LEASE_S}, persistence=persistence
    )
    board.connect()
    conductors = fleet.Fleet(str(tmp_path), board_url, persistence_url, LEASE_S)
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # a stall report shows their stacks
    try:
        members = [conductors.start(wait=False) for _ in range(3)]
        for member in members:
            conductors.wait_log(member, "ready on board", WAIT_S)
        jobs = [
            fleet.post(
                board,
                persistence,
                ledger_flows.chain_factory,
                {"ledger": ledger, "job": f"j{i}", "delay": TASK_DELAY_S},
                name=f"j{i}",
            )
            for i in range(JOBS)
        ]

        def finished() -> int:
            return sum(1 for r in checker.read(ledger) if r["task"] == "t2" and r["ev"] == "end")

        waiting.wait_until(
            lambda: finished() >= DONE_BEFORE_KILL, f"{DONE_BEFORE_KILL} jobs to finish", WAIT_S
        )
        # When the leader is killed -9 mid-run
        done_at_kill = finished()
        killed, killed_at = e.kill_leader()
        kill_wall = time.time() - (time.monotonic() - killed_at)  # the kill, on the wall clock
        new_leader = e.wait_for_leader(excluding=killed)
        elected_s = time.monotonic() - killed_at
        # Then every job finishes (the test's own board rides it out too)
        outcomes = _outcomes_within(board, jobs, killed_at + ALL_DONE_S)
        all_done_s = time.monotonic() - killed_at
        unfinished = [j for j in jobs if outcomes[j.uuid] is None]
        if unfinished:
            pytest.fail(_stall_report(board, unfinished, conductors, ledger), pytrace=False)
        assert all(o.outcome == "succeeded" for o in outcomes.values()), outcomes
        # And each task ran once: none lost, none re-run, none run twice at once
        keys = [(f"j{i}", t) for i in range(JOBS) for t in ("t0", "t1", "t2")]
        verdict = checker.check(ledger, keys)
        concurrent = verdict.overlapping()
        first_new_s = _first_consume_after(e.hosts, f"{board.path}/consumed", jobs, kill_wall)
        sys.stderr.write(
            f"\n[zookeeper ensemble fault] {JOBS} jobs x 3 tasks on 3 conductors; leader node"
            f" {killed + 1} killed -9 with {done_at_kill} jobs done; node {new_leader + 1}"
            f" leads {elected_s:.2f} s later; first job consumed {first_new_s:.2f} s"
            f" after the kill; all done {all_done_s:.2f} s after; {verdict.summary()};"
            f" concurrent {len(concurrent)}\n"
        )
        assert not verdict.lost, verdict.summary()
        assert not concurrent, concurrent
        assert not verdict.duplicated, verdict.summary()
        assert len(verdict.done_once) == len(keys)
        assert not verdict.cut, verdict.cut  # no conductor died: no run was cut short
        conductors.wait_consumed(set(outcomes), WAIT_S)
        consumed = conductors.consumed_lines()
        assert all(len(consumed.get(u, [])) == 1 for u in outcomes), consumed
    finally:
        conductors.stop()
        board.close()
        persistence.close()


def test_a_multi_cut_off_by_a_connection_loss_is_replayed_to_take_effect_once(ensemble):
    # Given a ZooKeeper persistence connection, and a multi (two creates and a
    # delete) that a connection loss cut off after the ensemble applied it
    client = kazoo_utils.make_client({"hosts": ensemble.ensemble.hosts})
    root = f"/flowengine-test/replay-{uuid.uuid4().hex[:8]}"
    backend = impl_zookeeper.ZkBackend({"path": root}, client=client)
    try:
        conn = backend.get_connection()
        client.create(f"{root}/gone", b"", makepath=True)
        applied = client.transaction()
        applied.create(f"{root}/a", b"1")
        applied.create(f"{root}/b", b"2")
        applied.delete(f"{root}/gone")
        applied.commit()
        # When what is left of it is rebuilt from what the ensemble holds
        rest = conn._remaining(applied.operations)
        # Then nothing is left to do: committing it changes nothing
        assert rest.operations == []
        # And a create whose znode holds other data is kept, to fail as it would have
        client.set(f"{root}/b", b"someone else's")
        assert [type(op).__name__ for op in conn._remaining(applied.operations).operations] == [
            "Create"
        ]
        # And a multi that was not applied is replayed whole
        fresh = client.transaction()
        fresh.create(f"{root}/c", b"3")
        fresh.set_data(f"{root}/a", b"4")
        replay = conn._remaining(fresh.operations)
        replay.commit()
        assert client.get(f"{root}/c")[0] == b"3" and client.get(f"{root}/a")[0] == b"4"
    finally:
        backend.close()
        kazoo_utils.finalize_client(client)


def test_a_request_left_unanswered_fails_within_the_bound_and_is_made_again(ensemble, monkeypatch):
    # Given a ZooKeeper persistence connection whose first read is lost (its
    # answer never comes, as a request lost in a reconnection), and a short bound
    monkeypatch.setattr(impl_zookeeper, "OP_TIMEOUT_S", 0.2)
    client = kazoo_utils.make_client({"hosts": ensemble.ensemble.hosts})
    root = f"/flowengine-test/bound-{uuid.uuid4().hex[:8]}"
    backend = impl_zookeeper.ZkBackend({"path": root}, client=client)
    try:
        conn = backend.get_connection()
        client.create(f"{root}/item", b'{"v": 1}', makepath=True)
        real_get_async = client.get_async
        lost: list[str] = []

        def get_async_losing_the_first(path, *args, **kwargs):
            if not lost:
                lost.append(path)
                return client.handler.async_result()  # never answered
            return real_get_async(path, *args, **kwargs)

        monkeypatch.setattr(client, "get_async", get_async_losing_the_first)
        # When the item is read
        started = time.monotonic()
        value = conn._get_item(f"{root}/item")
        # Then the lost request failed at the bound, and the read made again answered
        assert lost == [f"{root}/item"]
        assert value == {"v": 1}
        assert time.monotonic() - started < impl_zookeeper.RECONNECT_WAIT_S
        # And a request never answered at all fails the call (StorageFailure), not hangs it
        monkeypatch.setattr(impl_zookeeper, "RECONNECT_WAIT_S", 0.5)
        monkeypatch.setattr(client, "get_async", lambda *a, **k: client.handler.async_result())
        with pytest.raises(impl_zookeeper.exc.StorageFailure, match="timeout|no answer"):
            conn._get_item(f"{root}/item")
    finally:
        backend.close()
        kazoo_utils.finalize_client(client)
