"""Real ``flowengine worker`` processes for fault tests: start, watch their log, signal, stop."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from tests import waiting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Bounded wait (s), only so that a bug fails a test instead of hanging it.
WAIT_S = 30.0

#: Seconds between two looks at a file the test waits on.
POLL_S = 0.02

TASKS_MODULE = "tests.reliability.lifecycle_tasks"


def env() -> dict[str, str]:
    """Environment of a worker process: it imports this checkout (and the tests)."""
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )


def unique(prefix: str = "rel") -> str:
    """A fresh exchange name."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


#: tests.waiting.wait_until with this module's bound and pace.
wait_until = functools.partial(waiting.wait_until, timeout=WAIT_S, poll_s=POLL_S)


def wait_for_log(
    proc: subprocess.Popen[bytes], read_log: Callable[[], str], text: str, timeout: float = WAIT_S
) -> None:
    """Wait until a process's log (``read_log()``) holds ``text``; fail early if it died."""

    def seen() -> bool:
        if text in read_log():
            return True
        if proc.poll() is not None:
            raise AssertionError(
                f"process exited ({proc.returncode}) before logging {text!r}:\n{read_log()}"
            )
        return False

    try:
        wait_until(seen, f"{text!r} in the log", timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; the log:\n{read_log()}") from None


class WorkerProc:
    """One ``python -m flowengine worker`` process and its log file."""

    def __init__(
        self,
        exchange: str,
        topic: str,
        log_path: str,
        conn: dict[str, Any],
        threads: int = 2,
        extra: tuple[str, ...] = (),
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "flowengine",
            "worker",
            "--exchange",
            exchange,
            "--topic",
            topic,
            "--tasks",
            TASKS_MODULE,
            "--threads",
            str(threads),
            *extra,
        ]
        if conn.get("url"):
            cmd += ["--url", conn["url"]]
        for key, value in (conn.get("transport_options") or {}).items():
            cmd += ["--transport-option", f"{key}={json.dumps(value)}"]
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env())
        self.pid = self.proc.pid

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def wait_log(self, text: str, timeout: float = WAIT_S) -> None:
        """Wait until the worker logged ``text`` (fails early if it died)."""
        wait_for_log(self.proc, self.log, text, timeout)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()


@contextlib.contextmanager
def workers(
    count: int,
    exchange: str,
    topic: str,
    folder: str,
    conn: dict[str, Any],
    threads: int = 2,
    extra: tuple[str, ...] = (),
) -> Iterator[list[WorkerProc]]:
    """``count`` worker processes; SIGTERM then kill whatever is left at the end."""
    procs = [
        WorkerProc(
            exchange,
            topic,
            os.path.join(folder, f"worker-{i}.log"),
            conn,
            threads=threads,
            extra=extra,
        )
        for i in range(count)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def conn_for(kind: str, tmp_path: Any, request: Any) -> dict[str, Any]:
    """Executor/worker connection kwargs for 'filesystem' or 'redis'."""
    if kind == "filesystem":
        folder = tmp_path / "broker"
        folder.mkdir(exist_ok=True)
        return {
            "url": "filesystem://",
            "transport_options": {
                "data_folder_in": str(folder),
                "data_folder_out": str(folder),
                "store_processed": False,
            },
        }
    return {"url": request.getfixturevalue("redis_url")}
