"""The ``flowengine`` command's small promises: --version, -v anywhere, one-line errors."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import textwrap
import threading
from contextlib import redirect_stderr

import pytest

import flowengine
from flowengine import cli
from flowengine.commands import events_view
from flowengine.engines.worker_based import events
from tests.worker_based.executor_helpers import WAIT_S, running_executor, unique

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env() -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"flowengine {flowengine.__version__}"


@pytest.mark.parametrize(
    "argv, verbose",
    [
        (["graph", "m:f"], False),
        (["-v", "graph", "m:f"], True),
        (["graph", "-v", "m:f"], True),
        (["graph", "m:f", "--verbose"], True),
        (["worker", "--exchange", "e", "--topic", "t", "--tasks", "m", "-v"], True),
    ],
)
def test_verbose_is_accepted_before_and_after_the_subcommand(argv, verbose):
    assert cli._build_parser().parse_args(argv).verbose is verbose


def test_graph_refuses_an_extension_it_cannot_write(tmp_path, capsys):
    target = tmp_path / "flow.jpg"
    assert cli.main(["graph", "tests.commands.sample_flows:steps", "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowengine graph: cannot write")
    assert "'jpg' is not a format" in err and ".svg" in err and len(err.splitlines()) == 1
    assert not target.exists()


def test_worker_refuses_a_topic_given_twice(capsys):
    # Several topics are served in priority order (tests/ops); the same one
    # twice is a mistake.
    argv = [
        "worker",
        "--exchange",
        "e",
        "--topic",
        "a",
        "--topic",
        "a",
        "--tasks",
        "flowengine.demo.tasks",
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--topic given twice (a, a)" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "item, message",
    [
        ("json", "--tasks json: the module defines no task class"),
        ("no_such_module_xyz", "--tasks no_such_module_xyz: "),
        ("flowengine.demo.tasks:Nope", "--tasks flowengine.demo.tasks:Nope: "),
    ],
)
def test_worker_refuses_tasks_that_name_no_task(item, message, capsys):
    argv = ["worker", "--exchange", "e", "--topic", "t", "--tasks", item]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"flowengine worker: {message}") and len(err.splitlines()) == 1


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_worker_finds_task_modules_in_the_current_directory(tmp_path):
    # Given a task module in the directory `flowengine worker` starts in
    (tmp_path / "mytasks.py").write_text(
        textwrap.dedent("""
        from flowengine import task

        class Double(task.Task):
            def execute(self, x):
                return 2 * x
    """)
    )
    data = tmp_path / "broker"
    data.mkdir()
    exchange = unique()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowengine",
            "worker",
            "--exchange",
            exchange,
            "--topic",
            "t",
            "--tasks",
            "mytasks",
            "--transport",
            "filesystem",
            "--transport-option",
            f"data_folder={data}",
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        sys.path.insert(0, str(tmp_path))
        import mytasks  # the engine side needs the class too

        with running_executor(
            exchange, ["t"], transport="filesystem", transport_options={"data_folder": str(data)}
        ) as executor:
            # When a request for one of its tasks is sent
            assert executor.wait_for_workers(1, WAIT_S) == 0
            result = executor.execute_task(mytasks.Double("d"), "u-1", {"x": 21}).result(WAIT_S)
        # Then the worker ran it
        assert result[1] == 42
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mytasks", None)
        proc.terminate()
        out, _ = proc.communicate(timeout=WAIT_S)
    assert "mytasks.Double" in out


def test_events_says_why_it_sees_nothing():
    heard, stop = threading.Event(), threading.Event()
    err = io.StringIO()
    with redirect_stderr(err):
        events_view._notice_silence(heard, stop, "orders", after_s=0.01)
    assert "no event in 0 s: no worker on exchange 'orders' was started with --events" in (
        err.getvalue()
    )


def test_events_says_nothing_once_an_event_came():
    heard, stop = threading.Event(), threading.Event()
    heard.set()
    err = io.StringIO()
    with redirect_stderr(err):
        events_view._notice_silence(heard, stop, "orders", after_s=0.01)
    assert err.getvalue() == ""


#: Bounds a command that must fail at once (a broken setup would hang instead).
COMMAND_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_events_refuses_memory_as_run_and_worker_do(capsys):
    assert cli.main(["events", "--url", "memory://", "--exchange", "e"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("flowengine events: memory:// reaches only the process that uses it")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "url, words",
    [
        ("redis//localhost", "malformed broker URL 'redis//localhost'"),
        ("foo://localhost", "unknown broker transport 'foo'"),
        ("unreachable", "cannot reach the broker at redis://"),
    ],
)
@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_events_says_why_it_cannot_listen_and_draws_no_empty_view(url, words):
    if url == "unreachable":
        url = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there
    # When `flowengine events` is given a broker it cannot use
    proc = subprocess.run(
        [sys.executable, "-m", "flowengine", "events", "--url", url, "--exchange", unique()],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    # Then it exits with one line saying why, and no view of nothing on stdout
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"flowengine events: {words}"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


def test_events_stops_waiting_for_a_receiver_that_failed_before_connecting():
    # Given a receiver whose run() fails before it can consume (malformed URL)
    receiver = events.EventReceiver(unique(), lambda event: None, url="redis//localhost")
    stop = threading.Event()

    def consume() -> None:
        try:
            receiver.run()
        except Exception:  # what the command reports; not this test's subject
            pass
        finally:
            stop.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    # When the command waits for it to be ready (with a bound far past the
    # test's own timeout: waiting it out would fail the test)
    ready = events_view._wait_ready(receiver, stop, timeout_s=3600.0)
    # Then the wait ends with the receiver, not ready
    assert ready is False
    thread.join(WAIT_S)


def _no_worker_run(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    """`flowengine run` of a one-task flow on the worker-based engine with no worker."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "flowengine",
            "run",
            "tests.commands.sample_flows:steps",
            "--store",
            "v0=1",
            "--no-progress",
            "--engine",
            "worker-based",
            "--exchange",
            unique(),
            "--topic",
            "t",
            "--transport",
            "filesystem",
            "--transport-option",
            f"data_folder={tmp_path}",
            "--transition-timeout",
            "0.5",
            *extra,
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_run_shows_no_traceback_of_flowengine_itself_for_a_request_no_worker_took(tmp_path):
    proc = _no_worker_run(tmp_path)
    assert proc.returncode == 1
    assert "flowengine run: task 'step-0' failed: flowengine.exceptions.RequestTimeout" in (
        proc.stderr
    )
    assert "no worker serving task" in proc.stderr
    assert 'File "' not in proc.stderr, proc.stderr


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_run_with_verbose_shows_how_the_request_expired(tmp_path):
    proc = _no_worker_run(tmp_path, "-v")
    assert proc.returncode == 1
    # The housekeeper's own log line: when and why it gave up on the request
    assert "INFO flowengine.engines.worker_based.executor_side.housekeeper: Request" in (
        proc.stderr
    )
    assert "has expired after waiting" in proc.stderr


def _jobs_board(tmp_path) -> str:
    from flowengine.jobs import backends

    url = f"sqlite:///{tmp_path}/jobs.db"
    board = backends.fetch("pipe", {"board": url})
    board.connect()
    try:
        for i in range(3):
            board.post(f"job-{i}", details={"i": i})
    finally:
        board.close()
    return url


def _flows_store(tmp_path) -> str:
    from flowengine.persistence.backends import impl_dir
    from flowengine.utils import persistence_utils

    store = tmp_path / "store"
    backend = impl_dir.DirBackend({"path": str(store)})
    persistence_utils.temporary_flow_detail(backend)
    backend.close()
    return f"dir:{store}"


def _graph_of_steps(tmp_path) -> list[str]:
    return ["graph", "tests.commands.sample_flows:steps"]


@pytest.mark.parametrize(
    "argv",
    [
        lambda tmp_path: ["jobs", "list", "--board", _jobs_board(tmp_path)],
        lambda tmp_path: ["jobs", "list", "--json", "--board", _jobs_board(tmp_path)],
        lambda tmp_path: ["flows", "list", "--backend", _flows_store(tmp_path)],
        _graph_of_steps,
    ],
    ids=["jobs-list", "jobs-list-json", "flows-list", "graph"],
)
@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_closed_stdout_ends_the_command_quietly(tmp_path, argv):
    # Given a listing command whose reader went away before it wrote (`... | head -0`)
    args = argv(tmp_path)
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "flowengine", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=ROOT,
            timeout=WAIT_S * 6,
            check=False,
        )
    finally:
        os.close(write)
    # Then it ends quietly, as Unix tools do: no traceback, no error line, status 1
    assert proc.stderr == ""
    assert proc.returncode == cli.EXIT_STDOUT_CLOSED == 1


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_stdout_closed_midway_ends_the_command_quietly(tmp_path):
    # Given `flowengine jobs list | head -2` over more than a pipe holds
    from flowengine.jobs import backends

    url = f"sqlite:///{tmp_path}/jobs.db"
    board = backends.fetch("pipe", {"board": url})
    board.connect()
    try:
        for i in range(1500):
            board.post(f"job-{i}", details={"pad": "x" * 40})
    finally:
        board.close()
    proc = subprocess.run(
        f"'{sys.executable}' -m flowengine jobs list --board '{url}' | head -2; "
        'echo "status ${PIPESTATUS[0]}"',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=WAIT_S * 6,
        check=False,
    )
    # Then head shows the header and one job, and the command ends quietly
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and "job-0" in lines[1], proc.stdout
    assert lines[2] == "status 1"
    assert proc.stderr == ""
