"""Worker processes of either library for the interop tests over real brokers.

A TaskFlow worker is a small ``python -c`` script around TaskFlow's own
Worker; a flowengine worker is ``python -m flowengine worker``. Both import
the shared tasks with the base class of their own library (chosen by
``FLOWENGINE_INTEROP_LIBRARY``), so task class names match on the wire.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence

from tests import proc_utils
from tests.interop import harness
from tests.interop import shared_tasks as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds a worker process may take to start consuming (TaskFlow's imports
#: alone take about a second on a loaded machine).
START_TIMEOUT_S = 30.0

#: Seconds a worker process gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0

# The TaskFlow worker: TaskFlow's Worker, its drain period shortened, and a
# ready file written once it consumes (TaskFlow prints nothing when ready).
TASKFLOW_WORKER = """
import sys, threading
from taskflow.engines.worker_based import proxy, worker
proxy.DRAIN_EVENTS_PERIOD = float(sys.argv[5])
from tests.interop import shared_tasks
url, exchange, topic, ready = sys.argv[1:5]
w = worker.Worker(exchange=exchange, topic=topic, tasks=shared_tasks.class_paths(),
                  url=url, threads_count=4)
t = threading.Thread(target=w.run, kwargs={"display_banner": False}, daemon=True)
t.start()
w.wait()
open(ready, "w").close()
t.join()
"""


class WorkerProcess:
    """One worker process; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(
        self, library: str, cmd: Sequence[str], log_path: str, ready_path: str | None
    ) -> None:
        self.library = library
        self.log_path = log_path
        self.ready_path = ready_path
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
        )
        env[st.LIBRARY_ENV] = library
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            list(cmd), stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )

    def log_tail(self, chars: int = 3000) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-chars:]

    def wait_ready(self, deadline: float) -> None:
        """Block until the ready file exists (fail with the log if it never does)."""
        if self.ready_path is None:
            return
        while not os.path.exists(self.ready_path):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.library} worker exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.library} worker not ready in {START_TIMEOUT_S} s:\n{self.log_tail()}"
                )
            # A file written by the child is the signal; this bounded poll only
            # checks for it (there is no pipe to block on).
            time.sleep(0.05)

    def stop(self) -> None:
        proc_utils.stop_processes([self.proc], STOP_TIMEOUT_S)
        self._log.close()


def start_taskflow_worker(url: str, exchange: str, topic: str, folder: str) -> WorkerProcess:
    """A TaskFlow worker process serving the shared tasks."""
    ready = os.path.join(folder, f"taskflow-{exchange}.ready")
    cmd = [
        sys.executable,
        "-c",
        TASKFLOW_WORKER,
        url,
        exchange,
        topic,
        ready,
        str(harness.TASKFLOW_DRAIN_PERIOD_S),
    ]
    return WorkerProcess("taskflow", cmd, os.path.join(folder, f"taskflow-{exchange}.log"), ready)


def start_flowengine_worker(
    url: str, exchange: str, topic: str, folder: str, compat: str | None
) -> WorkerProcess:
    """``python -m flowengine worker`` serving the shared tasks."""
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
        st.__name__,
        "--threads",
        "4",
    ]
    if compat:
        cmd += ["--compat", compat]
    return WorkerProcess(
        "flowengine", cmd, os.path.join(folder, f"flowengine-{exchange}.log"), None
    )
