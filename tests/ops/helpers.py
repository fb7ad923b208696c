"""Starting real ``flowengine worker`` processes and running commands against them."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from tests import waiting
from tests.proc_utils import stop_processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Bound (s) on any wait for a worker or a command: only so a bug fails, not hangs.
WAIT_S = 60.0

#: Seconds a worker process gets to stop after SIGTERM before it is killed.
STOP_S = 20.0

#: Pause (s) between two inspections while waiting for a state to show: the
#: state is only visible by asking the worker.
POLL_S = 0.1


def env(**extra: str) -> dict[str, str]:
    """The environment of child processes: they import this very flowengine."""
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
        **extra,
    )


def broker_args(url: str, exchange: str) -> list[str]:
    """The options naming the broker and exchange."""
    return ["--url", url, "--exchange", exchange]


@contextlib.contextmanager
def worker_process(
    url: str,
    exchange: str,
    *extra: str,
    log: Any = None,
    tasks: str = "tests.ops.ops_tasks",
    environ: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """A ``flowengine worker`` process, answering ``inspect ping`` before the block starts."""
    args = list(extra)
    if "--topic" not in args:
        args += ["--topic", "ops"]
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "worker",
        *broker_args(url, exchange),
        "--tasks",
        tasks,
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        text=True,
        env=environ or env(),
        cwd=ROOT,
    )
    # A worker that requires signed messages answers only a signed ping.
    keys = (
        ["--secret-file", args[args.index("--secret-file") + 1]] if "--secret-file" in args else []
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not ping_pids(url, exchange, *keys).count(proc.pid):
            assert proc.poll() is None, f"worker exited with {proc.returncode}"
            assert time.monotonic() < deadline, "worker never answered inspect ping"
        yield proc
    finally:
        stop_processes([proc], STOP_S)


def flowengine(
    *args: str, timeout: float = WAIT_S, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a ``flowengine`` command to its end."""
    return subprocess.run(
        [sys.executable, "-m", "flowengine", *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
        cwd=ROOT,
        input=stdin,
    )


def inspect_json(url: str, exchange: str, what: str, *extra: str) -> list[dict[str, Any]]:
    """The answers of ``flowengine inspect WHAT --json`` (empty when nobody answered)."""
    proc = flowengine("inspect", what, *broker_args(url, exchange), "--json", *extra)
    assert proc.returncode in (0, 1), proc.stderr
    answers: list[dict[str, Any]] = json.loads(proc.stdout) if proc.stdout.strip() else []
    return answers


def ping_pids(url: str, exchange: str, *extra: str) -> list[int]:
    """Pids of the workers answering ``inspect ping`` (waits one --timeout)."""
    return [a["result"]["worker"]["pid"] for a in inspect_json(url, exchange, "ping", *extra)]


#: tests.waiting.wait_until, looking every POLL_S (each look may run a command).
wait_until = functools.partial(waiting.wait_until, timeout=WAIT_S, poll_s=POLL_S)
