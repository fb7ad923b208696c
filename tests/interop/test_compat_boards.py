"""One board shared by TaskFlow 6.5 and flowengine (``compat='taskflow'``): a rolling upgrade.

Given a real Redis or ZooKeeper board in TaskFlow's own layout, a poster of
one library in this process and the *other* library's blocking conductor in
a process of its own, both on one persistence (a SQLite file or a
PostgreSQL database): half the jobs are posted before the conductor starts
and half while it runs. Then every job ran exactly once, in the conductor's
library (its task appends ``tag library pid`` to a ledger), and left the
board. Both directions, both servers, both databases.

Each job's logbook is saved by the poster's library and read by the
conductor's (the persistence adopted by both, see test_taskflow_adoption.py):
the board and the database are shared as in a rolling upgrade.

And when a flowengine conductor dies mid-job (killed), its claim ends with
its lease (Redis) or its session (ZooKeeper) and a TaskFlow conductor runs
the job to its end.

Also: without compat, TaskFlow's msgpack postings in flowengine's namespace
are skipped (one warning each), flowengine lists and runs its own jobs, and
TaskFlow's board does not see (so cannot delete) flowengine's.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")
pytest.importorskip(
    "msgpack", reason="msgpack is not installed (pip install -e .[taskflow-compat])"
)

import sqlalchemy as sa  # noqa: E402

from tests import waiting  # noqa: E402
from tests.interop import compat_jobs  # noqa: E402

pytestmark = pytest.mark.broker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Jobs per test: half posted before the conductor starts, half while it runs.
JOBS = 10
#: Bound on a conductor process's whole run (imports included) on a loaded machine.
CONDUCTOR_TIMEOUT_S = 60.0
DIRECTIONS = [("flowengine", "taskflow"), ("taskflow", "flowengine")]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """An empty database both libraries reach: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
        return
    server = sa.engine.make_url(request.getfixturevalue("pg_url")).set(
        drivername="postgresql+psycopg"
    )
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    name = f"compat_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def _board_conf(server: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """TaskFlow's conf keys of a fresh board on the session's server."""
    if server == "redis":
        url = sa.engine.make_url(request.getfixturevalue("redis_url"))
        return {
            "board": "redis",
            "host": url.host,
            "port": url.port,
            "namespace": f"compat-{uuid.uuid4().hex[:8]}",
        }
    return {
        "board": "zookeeper",
        "hosts": request.getfixturevalue("zk_hosts"),
        "path": f"/compat-{uuid.uuid4().hex[:8]}/jobs",
    }


def _conf_for(library: str, conf: dict[str, Any]) -> dict[str, Any]:
    # flowengine shares TaskFlow's board in compat mode; TaskFlow needs nothing.
    return dict(conf, compat="taskflow") if library == "flowengine" else dict(conf)


def _fetch_board(library: str, conf: dict[str, Any], backend: Any) -> Any:
    board = compat_jobs._module(library, "jobs.backends").fetch("poster", conf, persistence=backend)
    board.connect()
    return board


def _ledger(path: str) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.split() for line in f if line.strip()]


def _start_conductor(
    library: str, conf: dict[str, Any], db: str, log_path: str, jobs: int = JOBS, hang: bool = False
) -> Any:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    env[compat_jobs.LIBRARY_ENV] = library
    env[compat_jobs.HANG_ENV] = "1" if hang else "0"
    log = open(log_path, "wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.interop.compat_jobs",
            library,
            json.dumps(conf),
            db,
            str(jobs),
            str(CONDUCTOR_TIMEOUT_S),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    ), log


@pytest.mark.parametrize("server", ["redis", "zookeeper"])
@pytest.mark.parametrize(
    "poster,conductor", DIRECTIONS, ids=[f"{p}-posts-{c}-runs" for p, c in DIRECTIONS]
)
def test_jobs_posted_by_one_library_run_once_by_the_others_conductor(
    server: str,
    poster: str,
    conductor: str,
    db_url: str,
    tmp_path: Any,
    request: pytest.FixtureRequest,
) -> None:
    # Given one board in TaskFlow's layout and one database for both libraries:
    # the poster saves each job's flow with its own library, the other reads it
    conf = _board_conf(server, request)
    ledger = str(tmp_path / "ledger")
    backend = compat_jobs.persistence(poster, db_url)
    board = _fetch_board(poster, _conf_for(poster, conf), backend)
    tags = [f"t{i:02d}" for i in range(JOBS)]

    def post(tag: str) -> Any:
        book = compat_jobs.save_book(poster, backend, tag, ledger)
        return board.post(
            f"job-{tag}", book=book, details={"store": {"ledger": ledger, "tag": tag}}
        )

    log_path = str(tmp_path / "conductor.log")
    proc, log = None, None
    try:
        # When half the jobs wait on the board before the other library's
        # conductor starts, and half are posted while it runs
        started = time.monotonic()
        jobs = [post(tag) for tag in tags[: JOBS // 2]]
        proc, log = _start_conductor(conductor, _conf_for(conductor, conf), db_url, log_path)
        waiting.wait_until(
            lambda: len(_ledger(ledger)) >= JOBS // 2 or proc.poll() is not None,
            "the conductor to run the first half",
            CONDUCTOR_TIMEOUT_S,
        )
        jobs += [post(tag) for tag in tags[JOBS // 2 :]]
        rc = proc.wait(CONDUCTOR_TIMEOUT_S)
        took = time.monotonic() - started
        with open(log_path, encoding="utf-8", errors="replace") as f:
            output = f.read()
        assert rc == 0, f"{conductor}'s conductor did not consume {JOBS} jobs:\n{output[-3000:]}"

        # Then each job ran exactly once, in the conductor's library, and left the board
        runs = _ledger(ledger)
        counts = collections.Counter(tag for tag, _lib, _pid in runs)
        assert counts == dict.fromkeys(tags, 1), f"runs per job: {counts}"
        assert {lib for _tag, lib, _pid in runs} == {conductor}
        assert all(job.wait(timeout=5) for job in jobs)  # complete, as the poster sees it
        assert board.job_count == 0
        assert [j for j in board.iterjobs(ensure_fresh=True)] == []
        print(
            f"\n[compat-board] {server} {poster}->{conductor} {db_url.split(':')[0]}:"
            f" {JOBS} jobs in {took:.2f} s incl. conductor start"
            f" ({output.strip().splitlines()[-1]})"
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if log is not None:
            log.close()
        board.close()
        backend.close()


@pytest.mark.parametrize("server", ["redis", "zookeeper"])
def test_a_job_whose_flowengine_conductor_died_is_run_by_a_taskflow_conductor(
    server: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    # Given a flowengine conductor (lease 1 s) that claimed a job and hangs in it.
    # (Both conductors must load the job's logbook: each library reads a copy
    # in its own format here, the same uuids in two SQLite files.)
    conf = _board_conf(server, request)
    ledger = str(tmp_path / "ledger")
    dbs = {lib: f"sqlite:///{tmp_path}/{lib}.db" for lib in ("flowengine", "taskflow")}
    backends = {lib: compat_jobs.persistence(lib, url) for lib, url in dbs.items()}
    board = _fetch_board("flowengine", _conf_for("flowengine", conf), backends["flowengine"])
    procs: list[Any] = []
    try:
        ids = (str(uuid.uuid4()), str(uuid.uuid4()))
        book = [compat_jobs.save_book(lib, be, "t0", ledger, ids) for lib, be in backends.items()][
            0
        ]
        job = board.post("job-t0", book=book, details={"store": {"ledger": ledger, "tag": "t0"}})
        dying = _start_conductor(
            "flowengine",
            dict(_conf_for("flowengine", conf), lease_s=1),
            dbs["flowengine"],
            str(tmp_path / "flowengine.log"),
            jobs=1,
            hang=True,
        )
        procs.append(dying)
        waiting.wait_until(
            lambda: _ledger(ledger),
            "the flowengine conductor to start the job",
            CONDUCTOR_TIMEOUT_S,
        )
        # When its host dies, and a TaskFlow conductor runs beside it
        started = time.monotonic()
        dying[0].kill()
        dying[0].wait()
        taking = _start_conductor(
            "taskflow", conf, dbs["taskflow"], str(tmp_path / "taskflow.log"), jobs=1
        )
        procs.append(taking)
        # Then the claim ends with the lease (Redis) or the session (ZooKeeper),
        # and TaskFlow's conductor runs the job to its end
        assert taking[0].wait(CONDUCTOR_TIMEOUT_S) == 0, open(tmp_path / "taskflow.log").read()
        took = time.monotonic() - started
        runs = _ledger(ledger)
        assert [r[1:2] + r[3:] for r in runs] == [["flowengine", "hung"], ["taskflow"]]
        assert job.wait(timeout=5) and board.job_count == 0
        print(
            f"\n[compat-board] {server}: a dead flowengine conductor's job finished by"
            f" TaskFlow {took:.2f} s after the kill (TaskFlow's start included)"
        )
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        board.close()
        for be in backends.values():
            be.close()


def test_taskflow_postings_in_flowengines_own_namespace_are_skipped_not_fatal(
    redis_url: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Given TaskFlow's board and flowengine's (no compat) on one Redis namespace
    from taskflow.jobs import backends as tf_backends

    from flowengine.conductors import backends as conductors
    from flowengine.jobs import backends
    from flowengine.persistence import backends as persistence

    url = sa.engine.make_url(redis_url)
    conf = {
        "board": "redis",
        "host": url.host,
        "port": url.port,
        "namespace": f"shared-{uuid.uuid4().hex[:8]}",
    }
    theirs = tf_backends.fetch("taskflow", dict(conf))
    theirs.connect()
    backend = persistence.fetch({"connection": "memory://"})
    ours = backends.fetch("flowengine", dict(conf), persistence=backend)
    ours.connect()
    caplog.set_level(logging.WARNING, logger="flowengine.jobs.backends.impl_redis")
    ledger = str(tmp_path / "ledger")
    try:
        # When TaskFlow posts there (msgpack), trashes another of its jobs (its
        # trash hash is flowengine's too), and flowengine posts its own job
        foreign = theirs.post("taskflow-job", details={"x": 1})
        trashed = theirs.post("taskflow-trashed")
        theirs.claim(trashed, "tf-conductor")
        theirs.trash(trashed, "tf-conductor")
        book = compat_jobs.save_book("flowengine", backend, "own", ledger)
        mine = ours.post("own-job", book=book, details={"store": {"ledger": ledger, "tag": "own"}})

        # Then TaskFlow's board lists its own job only, and deletes nothing
        for _ in range(2):
            assert [j.uuid for j in theirs.iterjobs()] == [foreign.uuid]
        # And flowengine lists its own job only, and reads past TaskFlow's trashed
        # posting again and again with one warning naming the cause
        for _ in range(3):
            assert [j.uuid for j in ours.iterjobs()] == [mine.uuid]
            assert ours.trashed() == []
        assert ours.job_count == 1
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1, warned
        assert trashed.uuid in warned[0] and "utf-8" in warned[0] and "msgpack" in warned[0]

        # And its conductor runs it, leaving TaskFlow's posting where it was
        conductor = conductors.fetch(
            "blocking", "flowengine-conductor", ours, persistence=backend, engine="serial"
        )
        conductor.run(max_dispatches=1)
        assert _ledger(ledger) == [["own", "flowengine", str(os.getpid())]]
        assert ours.wait_for_outcome(mine, timeout=10).outcome == "succeeded"
        assert [j.uuid for j in theirs.iterjobs()] == [foreign.uuid]
    finally:
        ours.close()
        theirs.close()
