"""The Redis board through Sentinel: 3 conductors finish 50 jobs across kill -9 of the master.

Given three ``flowengine conductor`` processes whose board reaches the
master through the Sentinels (TaskFlow's keys: ``sentinel``,
``sentinel_fallbacks``), SQLite persistence, and 50 three-task jobs
posted: when the master is killed -9 with 15 jobs done, the Sentinels
promote the replica and the conductors carry on against it. Then every job
succeeds and each task body ran once: none lost, none re-run, none run
twice at once. The board's writes (posts, claims, renewals, outcomes) wait
for the replica (``wait_replicas``, 1 by default through Sentinel), so the
failover takes away no claim: no job is claimed a second time while its
first conductor still runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid

import pytest

from flowengine.jobs import backends
from flowengine.persistence import backends as persistence_backends
from tests import waiting
from tests.clusters.redis.conftest import restore
from tests.conductors import checker, fleet, ledger_flows

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("redis_sentinel")]

#: The conductors' lease: short so that a lost claim would show soon,
#: long enough for a loaded machine to renew it (every third of it).
LEASE_S = 3.0
JOBS = 50
DONE_BEFORE_KILL = 15
#: The slow task's sleep: the fleet is mid-job at the kill.
TASK_DELAY_S = 0.2
#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 90.0
TASKS = ("t0", "t1", "t2")


def test_three_conductors_finish_50_jobs_each_once_across_a_master_failover(cluster, tmp_path):
    # Given three conductors on a board reached through the Sentinels, and 50 jobs
    namespace = f"t{uuid.uuid4().hex[:8]}"
    board_url = f"redis://127.0.0.1:{cluster.sentinel_ports[0]}"
    options = {
        "sentinel": cluster.service,
        "sentinel_fallbacks": cluster.fallbacks,
        "namespace": namespace,
    }
    persistence_url = f"sqlite:///{tmp_path}/flows.db"
    ledger = os.path.join(tmp_path, "ledger.jsonl")
    persistence = persistence_backends.fetch(persistence_url)
    with contextlib.closing(persistence.get_connection()) as conn:
        conn.upgrade()
    board = backends.fetch(
        "poster", {"board": board_url, "lease_s": LEASE_S, **options}, persistence=persistence
    )
    board.connect()
    extra = [a for k, v in options.items() for a in ("--board-option", f"{k}={json.dumps(v)}")]
    conductors = fleet.Fleet(str(tmp_path), board_url, persistence_url, LEASE_S, extra=extra)
    killed = None
    try:
        members = [conductors.start(concurrency=2, wait=False) for _ in range(3)]
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
        # When the master is killed -9 mid-run
        done_at_kill = finished()
        old_port = cluster.master_port()
        killed = next(s for s in cluster.servers() if s.port == old_port)
        kill_wall = time.time()
        killed_at = cluster.kill_master()
        cluster.wait_for_new_master(old_port)
        failover_s = time.monotonic() - killed_at
        # Then every job finishes (the test's own board rides it out too)
        outcomes = {job.uuid: board.wait_for_outcome(job, WAIT_S) for job in jobs}
        all_done_s = time.monotonic() - killed_at
        assert all(o is not None and o.outcome == "succeeded" for o in outcomes.values()), [
            u for u, o in outcomes.items() if o is None or o.outcome != "succeeded"
        ]
        # And each task ran once: none lost, none re-run, none run twice at once
        keys = [(f"j{i}", t) for i in range(JOBS) for t in TASKS]
        verdict = checker.check(ledger, keys)
        concurrent = verdict.overlapping()
        after = [o.at for o in outcomes.values() if o is not None and o.at > kill_wall]
        first_new_s = min(after) - kill_wall if after else float("nan")
        sys.stderr.write(
            f"\n[redis sentinel board] {JOBS} jobs x 3 tasks on 3 conductors; master killed"
            f" -9 with {done_at_kill} jobs done; Sentinels named the new master"
            f" {failover_s:.2f} s later; first job finished {first_new_s:.2f} s after the"
            f" kill; all done {all_done_s:.2f} s after; {verdict.summary()};"
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
        if killed is not None:
            restore(cluster, killed)
