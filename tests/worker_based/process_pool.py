"""The behaviour suite on real worker processes: one pool of processes per broker.

Each pool is two ``python -m flowengine worker`` processes serving the suite's
task modules on one exchange and topic of a broker (flowengine's filesystem
transport in a temporary folder, or the session's Redis / RabbitMQ). A pool
is started once, the first time a test of its engine kind asks for it, and
stopped at the end of the session; every engine the suite loads reaches it
through its own WorkerTaskExecutor, as separate client processes would.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

from flowengine import engines
from tests import proc_utils

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Worker processes per pool: two, so requests really are spread over processes.
POOL_PROCESSES = 2

#: Threads per worker process: enough for the suite's widest parallel branches.
POOL_THREADS = 4

#: Seconds to wait for both processes to announce themselves: a cold Python
#: start with imports is ~1 s; this only bounds a broken setup on a busy machine.
START_TIMEOUT_S = 60.0

#: Seconds a stopped worker process gets after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0

#: Seconds a request may wait for a pool worker: a task class no worker
#: serves then fails with RequestTimeout well before the test's own timeout.
TRANSITION_TIMEOUT_S = 10.0

#: Modules every pool serves (module names, imported by the worker processes).
TASK_MODULES = ("tests.engines.tasks", "tests.worker_based.pool_tasks")


@dataclass
class ProcessPool:
    """Worker processes on one broker, and the engine options that reach them."""

    kind: str
    url: str | None
    transport: str | None = None
    transport_options: dict[str, Any] = field(default_factory=dict)
    exchange: str = field(default_factory=lambda: f"behaviour-{uuid.uuid4().hex[:8]}")
    topic: str = "behaviour"
    procs: list[subprocess.Popen] = field(default_factory=list)
    log_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="fe-pool-log-"))

    def _command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "flowengine",
            "worker",
            "--exchange",
            self.exchange,
            "--topic",
            self.topic,
            "--threads",
            str(POOL_THREADS),
            "--tasks",
            *TASK_MODULES,
        ]
        if self.url:
            cmd += ["--url", self.url]
        if self.transport:
            cmd += ["--transport", self.transport]
        for key, value in self.transport_options.items():
            cmd += ["--transport-option", f"{key}={json.dumps(value)}"]
        return cmd

    def options(self) -> dict[str, Any]:
        """Engine options (``engines.load`` keywords) reaching this pool."""
        opts: dict[str, Any] = {
            "exchange": self.exchange,
            "topics": [self.topic],
            "transition_timeout": TRANSITION_TIMEOUT_S,
        }
        if self.url:
            opts["url"] = self.url
        if self.transport:
            opts["transport"] = self.transport
        if self.transport_options:
            opts["transport_options"] = dict(self.transport_options)
        return opts

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every worker's output, for failure messages."""
        parts = []
        for i in range(len(self.procs)):
            try:
                with open(os.path.join(self.log_dir, f"worker-{i}.log"), errors="replace") as f:
                    parts.append(f"--- worker {i} ---\n" + f.read()[-chars:])
            except OSError:
                pass
        return "\n".join(parts)

    def start(self) -> None:
        """Start the processes and wait until every one has announced itself."""
        from flowengine.engines.worker_based.executor_side import executor as wbe

        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
        )
        for i in range(POOL_PROCESSES):
            with open(os.path.join(self.log_dir, f"worker-{i}.log"), "wb") as log:
                self.procs.append(
                    subprocess.Popen(
                        self._command(),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=ROOT,
                        preexec_fn=_die_with_parent,
                    )
                )
        opts = self.options()
        probe = wbe.WorkerTaskExecutor(
            f"pool-probe-{uuid.uuid4().hex[:8]}",
            self.exchange,
            [self.topic],
            url=opts.get("url"),
            transport=opts.get("transport"),
            transport_options=opts.get("transport_options"),
        )
        probe.start()
        try:
            missing = probe.wait_for_workers(POOL_PROCESSES, START_TIMEOUT_S)
        finally:
            probe.stop()
        dead = [p.pid for p in self.procs if p.poll() is not None]
        if missing or dead:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(
                f"{self.kind} worker pool did not start ({missing} missing,"
                f" exited: {dead}):\n{tail}"
            )

    def stop(self) -> None:
        """SIGTERM every process, kill those still there after STOP_TIMEOUT_S."""
        proc_utils.stop_processes(self.procs, STOP_TIMEOUT_S)
        self.procs.clear()
        shutil.rmtree(self.log_dir, ignore_errors=True)


#: prctl(2) option: signal this process when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the test process dies (Linux only).

    A killed pytest run must not leave worker processes behind.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: stop() is then the only cleanup


#: engine kind -> the running pool (set by the session fixtures in tests/engines).
ACTIVE: dict[str, ProcessPool] = {}


def filesystem_pool(folder: str) -> ProcessPool:
    """A pool over flowengine's filesystem transport in ``folder``."""
    return ProcessPool("filesystem", None, "filesystem", {"data_folder": folder})


def loader(kind: str):
    """A behaviour-suite loader for engine kind ``kind`` (its pool must be in ACTIVE)."""

    def load(flow: Any, store: Any, options: dict) -> Any:
        pool = ACTIVE[kind]
        return engines.load(
            flow, store=store, engine="worker-based", **{**pool.options(), **options}
        )

    return load
