"""A new user's mistakes get one precise error, fast, and nothing is lost.

Each test makes one mistake against a real broker (or none at all, for the
ones that must be caught before connecting) and checks the exact words the
user reads. Waits are bounded so that a hang fails; no test asserts a time.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.parse

import kombu
import pytest
import redis

from flowengine import cli, engines, states
from flowengine import exceptions as exc
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.messaging import consumer
from flowengine.patterns import linear_flow as lf
from tests.worker_based import executor_tasks as et
from tests.worker_based.executor_helpers import MEMORY, WAIT_S, running_worker, unique

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: Bounds a command that must fail at once (a broken setup would hang instead).
COMMAND_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_engine(url: str, exchange: str | None = None, **options) -> None:
    flow = lf.Flow("f").add(et.Echo("e"))
    engines.run(
        flow,
        store={"value": 1},
        engine="worker-based",
        url=url,
        exchange=exchange or unique(),
        topics=["t"],
        **options,
    )


def _with_password(url: str, password: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = f"{parts.username or ''}:{password}@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.parametrize(
    "url, words",
    [
        ("redis//localhost", "malformed broker URL 'redis//localhost': expected scheme://host"),
        ("foo://localhost", "unknown broker transport 'foo' in foo://localhost"),
    ],
)
def test_a_url_no_transport_can_mean_is_refused_before_connecting(url, words):
    with pytest.raises(exc.BrokerConfigError) as info:
        _run_engine(url)
    assert str(info.value).startswith(words)


@pytest.mark.broker
@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_an_unreachable_broker_is_named(scheme):
    port = _free_port()  # nothing listens there
    url = (
        f"redis://127.0.0.1:{port}/0"
        if scheme == "redis"
        else f"amqp://guest:secret@127.0.0.1:{port}//"
    )
    with pytest.raises(exc.BrokerUnavailable) as info:
        _run_engine(url)
    message = str(info.value)
    assert message.startswith(f"cannot reach the broker at {scheme}://")
    assert f"127.0.0.1:{port}" in message and "secret" not in message


@pytest.mark.broker
def test_a_wrong_redis_password_is_a_login_error(private_redis):
    # Given a Redis that wants a password
    redis.Redis.from_url(private_redis.url).config_set("requirepass", "right")
    # When an engine logs in with another one, then the error says so
    with pytest.raises(exc.BrokerConfigError) as info:
        _run_engine(_with_password(private_redis.url, "wrong"))
    message = str(info.value)
    assert "refused the login" in message and "wrong" not in message


@pytest.mark.broker
def test_a_wrong_rabbitmq_password_is_a_login_error(amqp_url):
    with pytest.raises(exc.BrokerConfigError) as info:
        _run_engine(_with_password(amqp_url, "wrong"))
    assert "refused the login" in str(info.value)
    assert "ACCESS_REFUSED" in str(info.value)


@pytest.mark.broker
def test_an_exchange_declared_by_taskflow_names_the_compat_option(amqp_url):
    # Given an exchange declared as TaskFlow declares it (transient, auto-delete)
    exchange = unique()
    with kombu.Connection(amqp_url) as conn:
        taskflow_like = kombu.Exchange(exchange, type="direct", durable=False, auto_delete=True)
        queue = kombu.Queue(f"{exchange}_t", taskflow_like, routing_key="t", auto_delete=True)
        bound = queue(conn.default_channel)
        bound.declare()  # keeps the auto-delete exchange alive meanwhile
        # When a flowengine engine (default settings) uses it
        with pytest.raises(exc.BrokerConfigError) as info:
            _run_engine(amqp_url, exchange)
        bound.delete()
    # Then the error explains the conflict and names the way out
    message = str(info.value)
    assert f"exchange {exchange!r}" in message and "PRECONDITION_FAILED" in message
    assert "compat='taskflow'" in message


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_no_worker_serving_the_task_warns_early_and_times_out_once(caplog):
    # Given a worker that serves Echo but not Other
    exchange = unique()
    flow = lf.Flow("f").add(et.RevertRecorder("done"), et.Other("missing"))
    with (
        running_worker(exchange, "t", [et.RevertRecorder, et.Echo]),
        caplog.at_level(logging.INFO, logger="flowengine.engines.worker_based.executor_side"),
    ):
        engine = engines.load(
            flow,
            store={"value": 1},
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            transition_timeout=2.0,
            **MEMORY,
        )
        # When the flow runs, Other's request finds nobody
        with pytest.raises(exc.RequestTimeout) as info:
            engine.run()
    # Then the user was warned before the timeout, with the task and the topic
    warned = [
        r for r in caplog.records if r.levelno == logging.WARNING and "waits:" in r.getMessage()
    ]
    assert len(warned) == 1
    text = warned[0].getMessage()
    assert "no worker serving task 'tests.worker_based.executor_tasks.Other'" in text
    assert f"topic(s) 't' of exchange {exchange!r}" in text
    assert "serve only tests.worker_based.executor_tasks.Echo" in text
    # the timeout says why,
    assert "no worker serving task 'tests.worker_based.executor_tasks.Other'" in str(info.value)
    # what ran was reverted, and the task that never ran needed no second timeout
    assert engine.storage.get_atom_state("done") == states.REVERTED
    assert engine.storage.get_atom_state("missing") == states.REVERTED
    expiries = [r for r in caplog.records if "has expired" in r.getMessage()]
    assert len(expiries) == 1


def test_remote_failures_stay_wrapped_by_default_as_on_taskflow():
    exchange = unique()
    with running_worker(exchange, "t", [et.Fail]):
        with pytest.raises(exc.WrappedFailure) as info:
            engines.run(
                lf.Flow("f").add(et.Fail("boom")),
                engine="worker-based",
                exchange=exchange,
                topics=["t"],
                **MEMORY,
            )
    assert info.value.check(RuntimeError) is not None


def test_remote_exceptions_original_raises_the_tasks_own_exception():
    exchange = unique()
    with running_worker(exchange, "t", [et.Fail]):
        with pytest.raises(RuntimeError, match="^Woot!$") as info:
            engines.run(
                lf.Flow("f").add(et.Fail("boom")),
                engine="worker-based",
                exchange=exchange,
                topics=["t"],
                remote_exceptions="original",
                **MEMORY,
            )
    assert type(info.value) is RuntimeError


def test_remote_exceptions_is_checked():
    with pytest.raises(ValueError, match="remote_exceptions must be one of wrapped, original"):
        engines.load(
            lf.Flow("f").add(et.Fail("boom")),
            engine="worker-based",
            exchange=unique(),
            topics=["t"],
            remote_exceptions="raw",
            **MEMORY,
        )


def test_memory_is_refused_where_other_processes_need_the_broker(capsys):
    assert cli.main(["demo", "--url", "memory://"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("flowengine demo: memory:// reaches only the process that uses it")
    assert len(err.splitlines()) == 1


def _env() -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_run_names_the_failed_task_with_its_remote_traceback(tmp_path):
    # Given a worker process serving a task that raises
    (tmp_path / "failing.py").write_text(
        textwrap.dedent("""
        from flowengine import task
        from flowengine.patterns import linear_flow

        class Boom(task.Task):
            def execute(self):
                raise ValueError("the printer is on fire")

        def make():
            return linear_flow.Flow("f").add(Boom())
    """)
    )
    conn = [
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={tmp_path}",
        "--exchange",
        unique(),
        "--topic",
        "t",
    ]
    worker = subprocess.Popen(
        [sys.executable, "-m", "flowengine", "worker", *conn, "--tasks", "failing"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # When `flowengine run` runs it there
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "flowengine",
                "run",
                "failing:make",
                "--engine",
                "worker-based",
                "--no-progress",
                *conn,
            ],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker_log, _ = worker.communicate(timeout=WAIT_S)
    # Then it names the task and shows where the worker raised
    assert proc.returncode == 1
    assert "flowengine run: task 'failing.Boom' failed: ValueError: the printer is on fire" in (
        proc.stderr
    )
    assert 'raise ValueError("the printer is on fire")' in proc.stderr
    # and the worker logged it at WARNING with the task's name
    assert "WARNING" in worker_log and "Task 'failing.Boom'" in worker_log
    assert "failed in" in worker_log and "the printer is on fire" in worker_log


@pytest.mark.broker
def test_a_worker_without_its_broker_retries_quietly_and_stops_on_sigterm():
    # Given a worker whose broker is not there
    url = f"redis://127.0.0.1:{_free_port()}/0"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowengine",
            "worker",
            "--url",
            url,
            "--exchange",
            unique(),
            "--topic",
            "t",
            "--tasks",
            "flowengine.demo.tasks",
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # When it has tried twice
        lines = []
        for line in proc.stdout:
            if "cannot reach the broker" in line:
                lines.append(line)
                if len(lines) == 2:
                    break
        # Then each attempt is one line, and the pause doubles between them
        first = consumer.RECONNECT_BACKOFF_S
        assert f"tries again in {first:.0f} s" in lines[0]
        assert f"tries again in {2 * first:.0f} s" in lines[1]
    finally:
        # and SIGTERM stops it while it waits
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_the_executor_gives_up_on_an_unreachable_broker_without_leftovers():
    port = _free_port()
    executor = wex.WorkerTaskExecutor(
        unique(), unique(), ["t"], url=f"amqp://guest:guest@127.0.0.1:{port}//"
    )
    with pytest.raises(exc.BrokerUnavailable):
        executor.start()
    executor.stop()  # idempotent after a failed start
