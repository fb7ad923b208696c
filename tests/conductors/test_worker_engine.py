"""The worker-based engine under a conductor: tasks run on `flowengine worker` processes.

Engine options come from the conductor (``--engine``/``--engine-option``) or
from the job's details (``engine``/``engine_options``); either way the
ledger shows the tasks ran in the worker's process, not the conductor's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from flowengine import engines  # noqa: E402
from flowengine.persistence import models  # noqa: E402
from flowengine.utils import persistence_utils as p_utils  # noqa: E402
from tests.conductors import checker, ledger_flows  # noqa: E402
from tests.conductors.test_faults import JOB_DONE_S, Env  # noqa: E402
from tests.jobs.boards import Boards  # noqa: E402
from tests.proc_utils import stop_processes  # noqa: E402

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture
def worker(redis_url, tmp_path):
    exchange = f"fe-jobs-{uuid.uuid4().hex[:8]}"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p),
    )
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowengine",
            "worker",
            "--url",
            redis_url,
            "--exchange",
            exchange,
            "--topic",
            "jobs",
            "--tasks",
            "tests.conductors.ledger_flows",
            "--threads",
            "2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    yield proc, {"url": redis_url, "exchange": exchange, "topics": ["jobs"]}
    stop_processes([proc], 15)
    log.close()


@pytest.mark.parametrize("options_from", ["conductor", "job"])
def test_worker_based_engine_under_a_conductor(redis_url, tmp_path, worker, options_from):
    # Given a worker process, and a conductor told the engine by its options or by the job
    proc, options = worker
    env = Env(tmp_path, Boards("redis", redis_url).url)
    try:
        details = {}
        if options_from == "conductor":
            env.fleet.extra += ["--engine", "worker-based"]
            for key, value in options.items():
                text = value if isinstance(value, str) else json.dumps(value)
                env.fleet.extra += ["--engine-option", f"{key}={text}"]
        else:
            details = {"engine": "worker-based", "engine_options": options}
        conductor = env.fleet.start()
        # When a job is posted
        book = models.LogBook("remote")
        fd = p_utils.create_flow_detail(
            ledger_flows.chain_factory(), book=book, backend=env.persistence
        )
        engines.save_factory_details(
            fd, ledger_flows.chain_factory, [], {}, backend=env.persistence
        )
        job = env.board.post(
            "remote",
            book,
            details={
                "flow_uuid": fd.uuid,
                **details,
                "store": {"ledger": env.ledger, "job": "r", "delay": 0.1},
            },
        )
        # Then it succeeds, every task once, every task body in the worker's process
        outcome = env.board.wait_for_outcome(job, JOB_DONE_S)
        assert outcome is not None and outcome.outcome == "succeeded", conductor.log()[-3000:]
        verdict = checker.check(env.ledger, [("r", "t0"), ("r", "t1"), ("r", "t2")])
        assert len(verdict.done_once) == 3, verdict.summary()
        assert {pid for runs in verdict.runs.values() for pid, *_ in runs} == {proc.pid}
    finally:
        env.close()
