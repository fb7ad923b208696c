"""`flowengine worker` processes serving outage_tasks.Mark for the broker outage fault tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence

from tests import proc_utils

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds a worker gets to leave after SIGTERM before it is killed (its
#: tasks are short; this only bounds a hang).
STOP_TIMEOUT_S = 15.0

TASKS = "tests.reliability.outage_tasks:Mark"


def worker_env(**extra: str) -> dict[str, str]:
    """Environment for a worker process: this checkout importable, no inherited keys."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    for key in ("FLOWENGINE_SECRET", "FLOWENGINE_SECRET_FILE"):
        env.pop(key, None)
    env.update(extra)
    return env


class WorkerProcs:
    """Started worker processes and their log files."""

    def __init__(self, logs: list[str], procs: list[subprocess.Popen]) -> None:
        self.logs = logs
        self.procs = procs

    def log_text(self) -> str:
        """Every worker's log, concatenated (for assertions and failure reports)."""
        parts = []
        for path in self.logs:
            with open(path, encoding="utf-8", errors="replace") as fh:
                parts.append(f"--- {os.path.basename(path)} ---\n{fh.read()}")
        return "\n".join(parts)


@contextlib.contextmanager
def running_workers(
    count: int,
    url: str,
    exchange: str,
    topic: str,
    log_dir: str,
    threads: int = 2,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[WorkerProcs]:
    """``count`` worker processes serving Mark on ``topic`` until the block ends."""
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "worker",
        "--url",
        url,
        "--exchange",
        exchange,
        "--topic",
        topic,
        "--tasks",
        TASKS,
        "--threads",
        str(threads),
        *extra_args,
    ]
    procs: list[subprocess.Popen] = []
    logs: list[str] = []
    try:
        for i in range(count):
            path = os.path.join(log_dir, f"outage-worker-{i}.log")
            logs.append(path)
            with open(path, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        cmd, stdout=log, stderr=subprocess.STDOUT, env=env or worker_env()
                    )
                )
        yield WorkerProcs(logs, procs)
    finally:
        proc_utils.stop_processes(procs, STOP_TIMEOUT_S)
