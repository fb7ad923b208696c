"""Fault tests with real ``flowengine conductor`` processes, each ending in the ledger checker.

Every task body appends to a ledger file; the checker counts, per job and
task, the runs that completed: once, more than once, or never. Conductors
share one board (parametrised over the kinds several processes can share)
and one SQLite persistence file.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from flowengine.jobs import backends  # noqa: E402
from flowengine.persistence import backends as persistence_backends  # noqa: E402
from tests.conductors import checker, fleet, ledger_flows  # noqa: E402
from tests.jobs.boards import SHARED_KINDS, Boards  # noqa: E402
from tests.jobs.conftest import board_base_url  # noqa: E402

#: Lease of the fleets here: short so the tests are quick, long enough for a
#: loaded 2-core machine to renew it (renewal every LEASE_S / 3).
LEASE_S = 2.0
#: Bound on "another conductor re-claims within the lease": lease plus slack
#: for process scheduling on a busy CI machine. A bound, never a measurement.
RECLAIM_WITHIN_S = LEASE_S + 10.0
#: Bound on a whole job finishing once it can run.
JOB_DONE_S = 60.0
#: Jobs and kills of the many-jobs test; FLOWENGINE_JOBS_STRESS / _KILLS for more.
STRESS_JOBS = int(os.environ.get("FLOWENGINE_JOBS_STRESS", "200"))
STRESS_KILLS = int(os.environ.get("FLOWENGINE_JOBS_STRESS_KILLS", "5"))
pytestmark = [pytest.mark.slow, pytest.mark.broker]


class Env:
    """One fault test's board, persistence, ledger and fleet."""

    def __init__(self, tmp_path, board_url: str, **board_options) -> None:
        self.workdir = str(tmp_path)
        self.ledger = os.path.join(self.workdir, "ledger.jsonl")
        self.persistence_url = f"sqlite:///{self.workdir}/flows.db"
        self.persistence = persistence_backends.fetch(self.persistence_url)
        with contextlib.closing(self.persistence.get_connection()) as conn:
            conn.upgrade()
        self.board_url = board_url
        self.board = backends.fetch(
            "flowengine",
            {"board": board_url, "lease_s": LEASE_S, **board_options},
            persistence=self.persistence,
        )
        self.board.connect()
        extra = [a for k, v in board_options.items() for a in ("--board-option", f"{k}={v}")]
        self.fleet = fleet.Fleet(
            self.workdir, board_url, self.persistence_url, LEASE_S, extra=extra
        )

    def post(self, factory, key: str, **store) -> object:
        return fleet.post(
            self.board,
            self.persistence,
            factory,
            {"ledger": self.ledger, "job": key, **store},
            name=key,
        )

    def wait_record(self, predicate, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for rec in checker.read(self.ledger):
                if predicate(rec):
                    return rec
            time.sleep(fleet.POLL_S)
        raise AssertionError(
            f"no such ledger record within {timeout_s} s: {checker.read(self.ledger)[-10:]}"
        )

    def flow_results(self, job) -> dict:
        with contextlib.closing(self.persistence.get_connection()) as conn:
            fd = conn.get_logbook(job.book_uuid).find(job.details["flow_uuid"])
        return {ad.name: ad.results for ad in fd}

    def close(self) -> None:
        self.fleet.stop()
        self.board.close()
        self.persistence.close()


@pytest.fixture
def env_factory(request, tmp_path):
    """``make(kind or URL, **board_options)``: an Env on a fresh namespace of that board."""
    made = []

    def make(kind: str, board_url: str | None = None, **board_options) -> Env:
        url = board_url or Boards(kind, board_base_url(kind, request)).url
        made.append(Env(tmp_path, url, **board_options))
        return made[-1]

    yield make
    for env in made:
        env.close()


shared = pytest.mark.parametrize("kind", SHARED_KINDS)


@shared
def test_kill9_owner_mid_task_another_resumes(env_factory, kind):
    # Given two conductors and a job whose middle task is slow
    env = env_factory(kind)
    env.fleet.start()
    env.fleet.start()
    job = env.post(ledger_flows.chain_factory, "j1", delay=3.0)
    started = env.wait_record(lambda r: r["task"] == "t1" and r["ev"] == "start", JOB_DONE_S)
    owner = env.fleet.by_pid(started["pid"])
    # When the owner is killed -9 in the middle of t1
    env.fleet.kill(owner)
    # Then another conductor re-claims it within the lease (plus slack) and finishes it
    again = env.wait_record(
        lambda r: r["task"] == "t1" and r["ev"] == "start" and r["pid"] != owner.pid,
        RECLAIM_WITHIN_S,
    )
    outcome = env.board.wait_for_outcome(job, JOB_DONE_S)
    assert outcome is not None and outcome.outcome == "succeeded"
    verdict = checker.check(env.ledger, [("j1", "t0"), ("j1", "t1"), ("j1", "t2")])
    assert verdict.done_once == [("j1", "t0"), ("j1", "t1"), ("j1", "t2")], verdict.summary()
    # t0 had finished before the kill: it never ran again
    assert [pid for pid, *_ in verdict.runs[("j1", "t0")]] == [owner.pid]
    assert verdict.cut[("j1", "t1")] == [(owner.pid, started["t"])]
    survivor = env.fleet.by_pid(again["pid"])
    env.fleet.wait_consumed({job.uuid})
    assert env.fleet.consumed_lines() == {job.uuid: [survivor.name]}
    assert outcome.who == survivor.name


@shared
def test_sigstop_past_the_lease_its_consume_and_writes_are_refused(env_factory, kind):
    # Given two conductors and a job whose middle task takes a while
    env = env_factory(kind)
    env.fleet.start()
    env.fleet.start()
    job = env.post(ledger_flows.chain_factory, "j1", delay=2.5)
    started = env.wait_record(lambda r: r["task"] == "t1" and r["ev"] == "start", JOB_DONE_S)
    paused = env.fleet.by_pid(started["pid"])
    # When its owner is paused (SIGSTOP) past its lease...
    env.fleet.kill(paused, signal.SIGSTOP)
    # ...another conductor takes the job over and finishes it
    outcome = env.board.wait_for_outcome(job, RECLAIM_WITHIN_S + JOB_DONE_S)
    assert outcome is not None and outcome.outcome == "succeeded"
    other = next(m for m in env.fleet.members if m is not paused)
    assert outcome.who == other.name
    # ...and the paused one is woken up (SIGCONT)
    env.fleet.kill(paused, signal.SIGCONT)
    # Then it learns it lost the job, and neither consumes it nor overwrites its state
    env.fleet.wait_log(paused, rf"job_lost {job.uuid}", JOB_DONE_S)
    env.fleet.wait_consumed({job.uuid})
    assert env.fleet.consumed_lines() == {job.uuid: [other.name]}
    assert env.flow_results(job)["t1"] == {"pid": other.pid}  # its own t1 result was refused
    verdict = checker.check(env.ledger, [("j1", "t0"), ("j1", "t2")])
    assert verdict.done_once == [("j1", "t0"), ("j1", "t2")], verdict.summary()
    assert [pid for pid, *_ in verdict.runs[("j1", "t2")]] == [other.pid]


@pytest.mark.parametrize(
    "kind,server_fixture",
    [
        ("redis", "persistent_redis"),
        ("postgresql", "private_pg"),
        ("zookeeper", "private_zookeeper"),
        ("etcd", "private_etcd"),
    ],
)
def test_board_server_restart_mid_job_the_job_completes(request, env_factory, kind, server_fixture):
    # Given a board server that keeps its data across a restart, and one conductor
    server = request.getfixturevalue(server_fixture)
    base = server.url + ("/flowengine-test/jobs" if kind == "zookeeper" else "")
    env = env_factory(kind, Boards(kind, base).url)
    env.fleet.start()
    job = env.post(ledger_flows.chain_factory, "j1", delay=2.0)
    env.wait_record(lambda r: r["task"] == "t1" and r["ev"] == "start", JOB_DONE_S)
    # When the server is killed and restarted in the middle of t1
    server.restart()
    # Then the job completes, every task once, consumed once
    outcome = env.board.wait_for_outcome(job, JOB_DONE_S)
    assert outcome is not None and outcome.outcome == "succeeded"
    verdict = checker.check(env.ledger, [("j1", "t0"), ("j1", "t1"), ("j1", "t2")])
    assert len(verdict.done_once) == 3, verdict.summary()
    env.fleet.wait_consumed({job.uuid})
    assert env.fleet.consumed_lines() == {job.uuid: ["c1"]}


@shared
def test_a_poison_job_ends_in_the_dead_letter(env_factory, kind):
    # Given conductors restarted when they die, and a job that kills its conductor
    attempts = 3
    env = env_factory(kind, max_attempts=attempts)
    env.fleet.start()
    env.fleet.start()
    job = env.post(ledger_flows.poison_factory, "poison")
    # When it has killed a conductor on each of its attempts
    deadline = time.monotonic() + attempts * (RECLAIM_WITHIN_S + 10)
    outcome = None
    while outcome is None and time.monotonic() < deadline:
        env.fleet.replace_dead(2)
        outcome = env.board.wait_for_outcome(job, 1.0)
    # Then it is in the dead letter, visible, and ran exactly max_attempts times
    assert outcome is not None and outcome.outcome == "dead"
    assert [j.uuid for j in env.board.dead_letters()] == [job.uuid]
    records = checker.read(env.ledger)
    poison_runs = [r["pid"] for r in records if r["task"] == "p" and r["ev"] == "start"]
    assert len(poison_runs) == attempts and len(set(poison_runs)) == attempts
    verdict = checker.check(env.ledger, [("poison", "t0")])
    assert verdict.done_once == [("poison", "t0")], verdict.summary()  # resumed, not rerun


def _wait_for_board(env, done, deadline: float) -> None:
    """Wait until ``done()`` or ``deadline``, woken by each change of the board."""
    while not done() and time.monotonic() < deadline:
        seen = env.board.change_seq
        if not done():
            env.board.wait_for_change(seen, 0.5)


@shared
def test_many_short_jobs_over_four_conductors_with_kills(env_factory, kind):
    # Given four conductors
    env = env_factory(kind)
    for _ in range(4):
        env.fleet.start(wait=False)
    # When many short jobs are posted in batches, and after each batch but the
    # last a random conductor is killed -9 once the fleet is at work on it
    # (and replaced). Killing between batches, not at a share of the jobs
    # done, makes every kill land while jobs are on the board however fast
    # the fleet runs next to this thread.
    rng = random.Random(1234)
    deadline = time.monotonic() + JOB_DONE_S + STRESS_JOBS * 0.5
    jobs: list = []
    kills = 0
    bounds = [STRESS_JOBS * b // (STRESS_KILLS + 1) for b in range(STRESS_KILLS + 2)]
    for low, high in zip(bounds, bounds[1:]):
        finished_before = len(jobs) - env.board.job_count
        jobs += [env.post(ledger_flows.short_factory, f"s{i}") for i in range(low, high)]
        if kills == STRESS_KILLS:
            break
        _wait_for_board(env, lambda: len(jobs) - env.board.job_count > finished_before, deadline)
        env.fleet.kill(rng.choice([m for m in env.fleet.members if m.alive()]))
        kills += 1
        env.fleet.replace_dead(4)
    _wait_for_board(env, lambda: env.board.job_count == 0, deadline)
    pending = {j.uuid for j in jobs if env.board.outcome(j) is None}
    # Then every job was consumed exactly once and none was lost
    assert len(env.fleet.killed_pids()) == STRESS_KILLS
    assert not pending, f"{len(pending)} jobs never finished"
    outcomes = {j.uuid: env.board.outcome(j) for j in jobs}
    assert all(o.outcome == "succeeded" for o in outcomes.values())
    consumed = env.fleet.consumed_lines()
    assert all(len(consumed.get(u, [])) <= 1 for u in outcomes), "a job consumed twice"
    keys = [(f"s{i}", "t0") for i in range(STRESS_JOBS)]
    verdict = checker.check(env.ledger, keys)
    assert not verdict.lost, verdict.summary()
    killed = env.fleet.killed_pids()
    for key in verdict.duplicated:  # a re-run only where a killed conductor had run it
        assert any(pid in killed for pid, *_ in verdict.runs[key]), (key, verdict.runs[key])


@shared
def test_sigterm_gives_the_job_back_at_once(env_factory, kind):
    # Given two conductors, one of them running a job's slow task
    env = env_factory(kind)
    env.fleet.start()
    env.fleet.start()
    job = env.post(ledger_flows.chain_factory, "j1", delay=3.0)
    started = env.wait_record(lambda r: r["task"] == "t1" and r["ev"] == "start", JOB_DONE_S)
    first = env.fleet.by_pid(started["pid"])
    second = next(m for m in env.fleet.members if m is not first)
    # When that one gets SIGTERM
    env.fleet.kill(first, signal.SIGTERM)
    # Then the other takes the job over before the first one's task even ended
    taken = env.wait_record(
        lambda r: r["task"] == "t1" and r["ev"] == "start" and r["pid"] == second.pid,
        RECLAIM_WITHIN_S,
    )
    first_end = env.wait_record(
        lambda r: r["task"] == "t1" and r["ev"] == "end" and r["pid"] == first.pid, JOB_DONE_S
    )
    assert taken["t"] < first_end["t"]
    outcome = env.board.wait_for_outcome(job, JOB_DONE_S)
    assert outcome is not None and outcome.who == second.name
    assert outcome.attempts == 1  # a graceful give-back is not a failed attempt
    assert first.proc.wait(fleet.STOP_TIMEOUT_S) == 0
    env.fleet.wait_consumed({job.uuid})
    assert env.fleet.consumed_lines() == {job.uuid: [second.name]}
