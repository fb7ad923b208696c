"""``flowengine inspect`` against real worker processes on Redis and RabbitMQ."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based.executor_side import executor as wex
from tests.ops import ops_tasks
from tests.ops.helpers import (
    WAIT_S,
    broker_args,
    env,
    flowengine,
    inspect_json,
    worker_process,
)


def _executor(url: str, exchange: str, topics: list[str]) -> wex.WorkerTaskExecutor:
    executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, topics, url=url)
    executor.start()
    return executor


def test_ping_names_each_worker_with_host_pid_topics_tasks_and_threads(real_broker, exchange):
    # Given two workers, one of them serving two topics with 3 threads
    with (
        worker_process(
            real_broker, exchange, "--topic", "high", "--topic", "low", "--concurrency", "3"
        ) as first,
        worker_process(real_broker, exchange, "--threads", "1") as second,
    ):
        # When ping is broadcast
        answers = inspect_json(
            real_broker, exchange, "ping", "--limit", "2", "--timeout", str(WAIT_S)
        )
        # Then each worker answers for itself
        by_pid = {a["result"]["worker"]["pid"]: a["result"]["worker"] for a in answers}
        assert set(by_pid) == {first.pid, second.pid}
        one = by_pid[first.pid]
        assert one["topics"] == ["high", "low"] and one["threads"] == 3
        assert "tests.ops.ops_tasks.Quick" in one["tasks"] and one["hostname"]
        assert one["held"] == 0 and one["running"] == 0
        assert by_pid[second.pid]["topics"] == ["ops"]
        # And the human table lists both workers
        table = flowengine(
            "inspect",
            "ping",
            *broker_args(real_broker, exchange),
            "--limit",
            "2",
            "--timeout",
            str(WAIT_S),
        )
        assert table.returncode == 0, table.stderr
        for worker in by_pid.values():
            assert worker["worker_id"] in table.stdout
        assert "HOST:PID" in table.stdout and "high, low" in table.stdout
        assert "2 worker(s) answered" in table.stderr


def test_a_broadcast_returns_once_the_workers_that_answered_last_time_answered(
    real_broker, exchange, tmp_path
):
    # Given two workers, and a first ping that waits out its timeout (nothing known yet)
    cache = env(FLOWENGINE_CACHE_DIR=str(tmp_path))
    ping = [
        sys.executable,
        "-m",
        "flowengine",
        "inspect",
        "ping",
        "--json",
        *broker_args(real_broker, exchange),
    ]
    with (
        worker_process(real_broker, exchange) as first,
        worker_process(real_broker, exchange) as second,
    ):
        learnt = subprocess.run(
            [*ping, "--timeout", "3"], capture_output=True, text=True, env=cache, timeout=WAIT_S
        )
        assert len(json.loads(learnt.stdout)) == 2, learnt.stderr
        # When ping is broadcast again with a timeout far longer than any answer takes
        started = time.monotonic()
        again = subprocess.run(
            [*ping, "--timeout", str(10 * WAIT_S)],
            capture_output=True,
            text=True,
            env=cache,
            timeout=2 * WAIT_S,
        )
        # Then it returns with both answers long before that timeout
        assert time.monotonic() - started < WAIT_S, "waited out the timeout"
        pids = {a["result"]["worker"]["pid"] for a in json.loads(again.stdout)}
        assert pids == {first.pid, second.pid}


def test_stats_and_registered_count_what_the_worker_did(real_broker, exchange):
    # Given a worker that ran one request successfully and one that failed
    with worker_process(real_broker, exchange):
        executor = _executor(real_broker, exchange, ["ops"])
        try:
            assert executor.wait_for_workers(1, WAIT_S) == 0
            ok = executor.execute_task(ops_tasks.Quick("q"), uuid.uuid4().hex, {"value": 7})
            bad = executor.execute_task(ops_tasks.Fails("f"), uuid.uuid4().hex, {})
            assert ok.result(WAIT_S) == (base.EXECUTED, 7)
            assert bad.result(WAIT_S)[1].check(ValueError)
        finally:
            executor.stop()
        # When stats and registered are asked
        [stats] = inspect_json(
            real_broker, exchange, "stats", "--limit", "1", "--timeout", str(WAIT_S)
        )
        [registered] = inspect_json(
            real_broker, exchange, "registered", "--limit", "1", "--timeout", str(WAIT_S)
        )
    # Then the counters say so, per task too
    totals = stats["result"]["stats"]["totals"]
    assert (totals["received"], totals["succeeded"], totals["failed"]) == (2, 1, 1)
    assert stats["result"]["stats"]["by_task"]["f"]["failed"] == 1
    assert "tests.ops.ops_tasks.Fails" in registered["result"]["worker"]["tasks"]


def test_no_worker_is_one_line_and_exit_status_1(real_broker, exchange):
    proc = flowengine("inspect", "ping", *broker_args(real_broker, exchange), "--timeout", "0.5")
    assert proc.returncode == 1
    assert "no worker answered within 0.5 s" in proc.stderr
    assert "guest:guest" not in proc.stderr  # never the password


def test_with_signing_on_only_a_signed_question_is_answered(real_broker, exchange, tmp_path):
    # Given a worker that requires signed messages
    keys = tmp_path / "keys"
    keys.write_text("s" * 40 + "\n")
    with worker_process(real_broker, exchange, "--secret-file", str(keys)):
        # When asked without the key, nobody answers (the worker refuses it unread)
        unsigned = flowengine(
            "inspect", "ping", *broker_args(real_broker, exchange), "--timeout", "1"
        )
        assert unsigned.returncode == 1
        # When asked with it, the worker answers (its answer signed and verified too)
        signed = inspect_json(
            real_broker,
            exchange,
            "ping",
            "--secret-file",
            str(keys),
            "--limit",
            "1",
            "--timeout",
            str(WAIT_S),
        )
    assert len(signed) == 1
