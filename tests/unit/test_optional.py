"""Optional parts without their extra: an ImportError that names the pip command."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Out of the fast tier (tests/fast_tier.py): runs Python processes without the extras.
pytestmark = pytest.mark.broker

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in a child: hiding a package from this process would leak into others.
_HIDE_AND_FETCH = textwrap.dedent("""
    import sys
    sys.modules[{hidden!r}] = None  # as if not installed
    from flowengine.persistence import backends
    try:
        backends.fetch("sqlite://")
    except ImportError as e:
        print(type(e).__name__, e, sep="|")
""")


@pytest.mark.parametrize("hidden", ["sqlalchemy", "alembic"])
def test_sql_backend_without_the_sql_extra_names_the_install_command(hidden):
    proc = subprocess.run(
        [sys.executable, "-c", _HIDE_AND_FETCH.format(hidden=hidden)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    kind, message = proc.stdout.strip().split("|")
    assert kind == "MissingExtra"
    assert f"needs the {hidden!r} package" in message
    assert "pip install 'flowengine[sql]'" in message


def test_the_worker_based_engine_does_not_import_the_redis_client():
    # Users of memory/filesystem/AMQP transports must not need redis-py.
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from flowengine.engines.worker_based import proxy, executor, worker\n"
        "print('ok')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


_HIDE_KAZOO = textwrap.dedent("""
    import sys
    sys.modules["kazoo"] = None  # as if not installed
    from flowengine.jobs import backends as boards
    from flowengine.persistence import backends
    for fetch in (lambda: backends.fetch("zookeeper://127.0.0.1:1/x"),
                  lambda: boards.fetch("b", {"board": "zookeeper"})):
        try:
            fetch()
        except ImportError as e:
            print(type(e).__name__, e, sep="|")
""")


def test_zookeeper_parts_without_the_zookeeper_extra_name_the_install_command():
    proc = subprocess.run(
        [sys.executable, "-c", _HIDE_KAZOO],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2, proc.stdout  # the persistence backend and the jobboard
    for line in lines:
        kind, message = line.split("|")
        assert kind == "MissingExtra"
        assert "needs the 'kazoo' package" in message
        assert "pip install 'flowengine[zookeeper]'" in message


# The command line, with a package hidden: what a user without the extra sees.
_HIDE_AND_RUN_CLI = textwrap.dedent("""
    import sys
    sys.modules[{hidden!r}] = None  # as if not installed
    from flowengine import cli
    sys.exit(cli.main({argv!r}))
""")


@pytest.mark.parametrize(
    "hidden, argv, extra",
    [
        ("uvicorn", ["dashboard", "--url", "filesystem://", "--exchange", "x"], "dashboard"),
        (
            "prometheus_client",
            [
                "worker",
                "--url",
                "filesystem://",
                "--exchange",
                "x",
                "--topic",
                "t",
                "--tasks",
                "flowengine.demo.tasks",
                "--metrics-port",
                "1",
            ],
            "metrics",
        ),
    ],
)
def test_a_command_without_its_extra_is_one_line_and_exit_status_2(hidden, argv, extra):
    code = _HIDE_AND_RUN_CLI.format(hidden=hidden, argv=argv)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"flowengine {argv[0]}: "), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"pip install 'flowengine[{extra}]'" in proc.stderr
