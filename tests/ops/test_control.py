"""``flowengine control cancel|shutdown`` against real worker processes (Redis, RabbitMQ)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

from flowengine import exceptions as exc
from flowengine.engines.worker_based.executor_side import executor as wex
from tests.ops import ops_tasks
from tests.ops.helpers import (
    ROOT,
    WAIT_S,
    broker_args,
    env,
    flowengine,
    inspect_json,
    wait_until,
    worker_process,
)


def _requests(url: str, exchange: str, what: str) -> dict[str, dict]:
    """Requests ``inspect WHAT`` shows, by uuid."""
    return {
        r["uuid"]: r for a in inspect_json(url, exchange, what) for r in a["result"]["requests"]
    }


def _cancel(url: str, exchange: str, request: str) -> str:
    proc = flowengine("control", "cancel", request, *broker_args(url, exchange))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _failure(future) -> object:
    outcome = future.result(WAIT_S)[1]
    assert outcome.check(exc.RequestCancelled), outcome
    return outcome


def test_cancel_a_running_request_raises_the_tasks_flag(real_broker, exchange):
    # Given a request running in a worker thread
    with worker_process(real_broker, exchange):
        executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["ops"], url=real_broker)
        executor.start()
        try:
            assert executor.wait_for_workers(1, WAIT_S) == 0
            request = uuid.uuid4().hex
            future = executor.execute_task(ops_tasks.WaitForCancel("wait"), request, {})
            active = wait_until(
                lambda: _requests(real_broker, exchange, "active").get(request),
                "the request to show in inspect active",
            )
            assert active["task"] == "wait" and active["attempt"] == 0
            # When it is cancelled
            out = _cancel(real_broker, exchange, request)
            # Then the task saw the flag and its engine gets a clear failure
            assert "running: its task sees the cancellation flag" in out
            assert "while it ran" in _failure(future).exception_str
        finally:
            executor.stop()


def test_cancel_kills_the_child_under_the_process_executor(real_broker, exchange):
    with worker_process(real_broker, exchange, "--executor", "processes"):
        executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["ops"], url=real_broker)
        executor.start()
        try:
            assert executor.wait_for_workers(1, WAIT_S) == 0
            request = uuid.uuid4().hex
            future = executor.execute_task(ops_tasks.Sleep("nap"), request, {})
            wait_until(
                lambda: request in _requests(real_broker, exchange, "active"), "the request to run"
            )
            out = _cancel(real_broker, exchange, request)
            assert "its process was killed" in out
            assert "its process was killed" in _failure(future).exception_str
        finally:
            executor.stop()


def test_cancel_a_queued_request_drops_it_before_it_starts(real_broker, exchange):
    # Given a one-thread worker running one request and holding another
    with worker_process(real_broker, exchange, "--concurrency", "1"):
        executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["ops"], url=real_broker)
        executor.start()
        try:
            assert executor.wait_for_workers(1, WAIT_S) == 0
            running, queued = uuid.uuid4().hex, uuid.uuid4().hex
            first = executor.execute_task(ops_tasks.WaitForCancel("w"), running, {})
            wait_until(
                lambda: running in _requests(real_broker, exchange, "active"),
                "the first request to run",
            )
            second = executor.execute_task(ops_tasks.Quick("q"), queued, {"value": 1})
            wait_until(
                lambda: queued in _requests(real_broker, exchange, "reserved"),
                "the second request to be reserved",
            )
            # When the queued one is cancelled, then the running one
            assert "queued: dropped before it starts" in _cancel(real_broker, exchange, queued)
            _cancel(real_broker, exchange, running)
            # Then neither ran to completion
            _failure(first)
            assert "before it started" in _failure(second).exception_str
        finally:
            executor.stop()


def test_cancel_of_a_request_no_worker_holds_says_so(real_broker, exchange):
    with worker_process(real_broker, exchange):
        out = _cancel(real_broker, exchange, "not-a-request")
    assert "held by none of the 1 worker(s)" in out


def test_shutdown_stops_one_worker_warm(real_broker, exchange):
    # Given two workers
    with (
        worker_process(real_broker, exchange) as doomed,
        worker_process(real_broker, exchange) as other,
    ):
        [answer] = [
            a
            for a in inspect_json(
                real_broker, exchange, "ping", "--limit", "2", "--timeout", str(WAIT_S)
            )
            if a["result"]["worker"]["pid"] == doomed.pid
        ]
        worker_id = answer["worker_id"]
        # When one of them is told to shut down (by the first characters of its id)
        proc = flowengine(
            "control", "shutdown", worker_id[:-4], *broker_args(real_broker, exchange)
        )
        assert proc.returncode == 0, proc.stderr
        assert f"Worker {worker_id}: warm shutdown started" in proc.stdout
        # Then it exits as after SIGTERM, and the other stays
        assert doomed.wait(WAIT_S) == 0
        assert other.poll() is None


def test_shutdown_of_an_unknown_worker_is_refused(real_broker, exchange):
    with worker_process(real_broker, exchange):
        proc = flowengine("control", "shutdown", "nobody", *broker_args(real_broker, exchange))
    assert proc.returncode == 2
    assert "no live worker match 'nobody'" in proc.stderr


def test_run_stopped_by_a_second_signal_cancels_what_its_workers_run(real_broker, exchange):
    # Given `flowengine run` whose one task runs on a worker until cancelled
    with worker_process(real_broker, exchange):
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowengine",
                "run",
                "tests.ops.ops_flows:waits_for_cancel",
                "--engine",
                "worker-based",
                *broker_args(real_broker, exchange),
                "--topic",
                "ops",
                "--no-progress",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            cwd=ROOT,
        )
        try:
            wait_until(
                lambda: _requests(real_broker, exchange, "active"), "the task to run on the worker"
            )
            # When it gets SIGINT twice (the second once the first was taken:
            # two signals at once are one for Python)
            run.send_signal(signal.SIGINT)
            for line in run.stderr:
                if "SIGINT: no new task starts" in line:
                    break
            run.send_signal(signal.SIGINT)
            run.communicate(timeout=WAIT_S)
            # Then the worker was asked to cancel the request, and did
            totals = wait_until(
                lambda: next(
                    (
                        a["result"]["stats"]["totals"]
                        for a in inspect_json(real_broker, exchange, "stats")
                        if a["result"]["stats"]["totals"]["cancelled"]
                    ),
                    None,
                ),
                "the worker to count the request cancelled",
            )
            assert totals["received"] == 1 and totals["succeeded"] == 0
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode != 0
