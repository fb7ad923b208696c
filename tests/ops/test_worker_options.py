"""Worker options: several topics in priority order, exception handlers, log and pid files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import pytest

from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.worker_side import worker as wk
from tests.ops import ops_tasks
from tests.ops.helpers import ROOT, WAIT_S, env, flowengine, wait_until, worker_process

# Out of the fast tier (tests/fast_tier.py): runs `flowengine worker` processes.
pytestmark = pytest.mark.broker


def _publish(proxy: px.Proxy, topic: str, tag: str, block: bool = False) -> None:
    """A request for Record straight to ``topic``'s queue (its replies go nowhere)."""
    body = {
        "task_cls": "tests.ops.ops_tasks.Record",
        "task_name": tag,
        "task_version": [1, 0],
        "action": pr.EXECUTE,
        "arguments": {"tag": tag, "block": block},
    }
    proxy.publish_body(
        pr.REQUEST, body, topic, reply_to="nobody-listens", correlation_id=uuid.uuid4().hex
    )


def test_a_worker_takes_the_higher_topic_first_when_both_have_work(real_broker, exchange):
    # Given a one-thread worker serving 'high' then 'low', busy with a blocked request
    ops_tasks.RECORDED.clear()
    ops_tasks.BLOCK.clear()
    ops_tasks.BLOCKED.clear()
    worker = wk.Worker(
        exchange,
        ["high", "low"],
        [ops_tasks.Record],
        threads_count=1,
        url=real_broker,
        control=False,
    )
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    sender = px.Proxy(
        "sender",
        exchange,
        None,
        broker=BrokerSettings(real_broker),
        options=px.ProxyOptions(queues=[]),
    )
    room = worker.priority_room
    assert room is not None and worker.wait(WAIT_S)
    try:
        _publish(sender, "high", "blocker", block=True)
        assert ops_tasks.BLOCKED.wait(WAIT_S)
        # When four 'low' requests, then four 'high' ones, wait behind it
        for i in range(4):
            _publish(sender, "low", f"low-{i}")
        for i in range(4):
            _publish(sender, "high", f"high-{i}")
        # (the worker holds two -- the blocker and the first to arrive -- and
        # each topic's loop waits with the next request of its queue)
        wait_until(
            lambda: room.held == 2 and tuple(room.waiting) == (1, 1),
            "both topics' loops to wait for their turn",
        )
        ops_tasks.BLOCK.set()
        with ops_tasks.RECORDED_CHANGED:
            assert ops_tasks.RECORDED_CHANGED.wait_for(
                lambda: len(ops_tasks.RECORDED) == 9, WAIT_S
            ), ops_tasks.RECORDED
    finally:
        ops_tasks.BLOCK.set()
        worker.stop()
        thread.join(WAIT_S)
    # Then, after the two it held, every 'high' request ran before any 'low' one
    order = ops_tasks.RECORDED[2:]
    highs = [i for i, tag in enumerate(order) if tag.startswith("high")]
    lows = [i for i, tag in enumerate(order) if tag.startswith("low")]
    assert max(highs) < min(lows), ops_tasks.RECORDED
    assert ops_tasks.RECORDED[0] == "blocker"


def _run_failing_task(url: str, exchange: str) -> None:
    executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["ops"], url=url)
    executor.start()
    try:
        assert executor.wait_for_workers(1, WAIT_S) == 0
        ok = executor.execute_task(ops_tasks.Quick("fine"), uuid.uuid4().hex, {})
        assert ok.result(WAIT_S) == (base.EXECUTED, 1)
        outcome = executor.execute_task(ops_tasks.Fails("broken"), "req-1", {}).result(WAIT_S)
        assert outcome[1].check(ValueError)
    finally:
        executor.stop()


def test_exception_handlers_run_in_order_before_the_default_log_line(
    real_broker, exchange, tmp_path
):
    # Given a worker with a handler recording failures, logging to a file at WARNING
    failures, log = tmp_path / "failures.jsonl", tmp_path / "worker.log"
    with worker_process(
        real_broker,
        exchange,
        "--exception-handler",
        "tests.ops.handlers:record",
        "--logfile",
        str(log),
        "--loglevel",
        "warning",
        environ=env(OPS_FAILURES_FILE=str(failures)),
    ):
        # When a task fails
        _run_failing_task(real_broker, exchange)
    # Then the handler saw it, and the default handler logged it at WARNING
    [seen] = [json.loads(line) for line in failures.read_text().splitlines()]
    assert seen["task"] == "broken" and seen["request"] == "req-1"
    assert seen["types"][0] == "ValueError" and seen["error"] == "broken on purpose"
    text = log.read_text()
    assert "WARNING" in text and "Task 'broken'" in text and "broken on purpose" in text
    assert " INFO " not in text  # --loglevel warning


def test_a_handler_returning_false_stops_the_chain(real_broker, exchange, tmp_path):
    log = tmp_path / "worker.log"
    with worker_process(
        real_broker,
        exchange,
        "--exception-handler",
        "tests.ops.handlers:swallow",
        "--logfile",
        str(log),
    ):
        _run_failing_task(real_broker, exchange)
    text = log.read_text()
    assert "Task 'fine'" in text  # INFO by default
    assert "Task 'broken'" not in text


def test_a_bad_exception_handler_is_refused_at_start(tmp_path):
    proc = flowengine(
        "worker",
        "--exchange",
        "x",
        "--topic",
        "t",
        "--tasks",
        "tests.ops.ops_tasks",
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={tmp_path}",
        "--exception-handler",
        "tests.ops.handlers:nothing_here",
    )
    assert proc.returncode == 2
    assert "--exception-handler tests.ops.handlers:nothing_here" in proc.stderr
    assert "has no 'nothing_here'" in proc.stderr


def test_the_pidfile_names_the_running_worker_and_refuses_a_second(real_broker, exchange, tmp_path):
    pidfile = tmp_path / "worker.pid"
    # Given a stale pid file (its process is gone)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pidfile.write_text(f"{dead.pid}\n")
    with worker_process(real_broker, exchange, "--pidfile", str(pidfile)) as worker:
        # Then it is replaced by the worker's pid
        assert pidfile.read_text().strip() == str(worker.pid)
        # And a second worker given the same file is refused
        second = flowengine(
            "worker",
            "--url",
            real_broker,
            "--exchange",
            exchange,
            "--topic",
            "ops",
            "--tasks",
            "tests.ops.ops_tasks",
            "--pidfile",
            str(pidfile),
        )
        assert second.returncode == 2
        assert f"process {worker.pid} is running with it" in second.stderr
    # And the file goes with the worker
    assert not os.path.exists(pidfile)


def test_a_bad_loglevel_is_refused():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowengine",
            "worker",
            "--exchange",
            "x",
            "--topic",
            "t",
            "--tasks",
            "tests.ops.ops_tasks",
            "--transport",
            "filesystem",
            "--loglevel",
            "LOUD",
        ],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=WAIT_S,
    )
    assert proc.returncode == 2
    assert "--loglevel LOUD: expected one of DEBUG, INFO" in proc.stderr
