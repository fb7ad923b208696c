"""Worker processes that reach their broker through a fault proxy each (network fault tests).

Every worker started here gets a :class:`tests.faultproxy.FaultProxy` of its
own in front of the broker, so a test can slow down, black-hole or cut one
worker's link while the others (and the test's own engine) keep theirs.
Workers serve tests.reliability.fault_tasks, whose bodies write the
start/end records tests/reliability/checker.py counts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests import faultproxy, proc_utils
from tests.reliability.harness import ROOT, STOP_TIMEOUT_S, env
from tests.reliability.worker_procs import wait_for_log

#: Bounded wait (s) for a flow, only so that a bug fails the test instead of hanging it.
FLOW_TIMEOUT_S = 90.0


@dataclass
class ProxiedWorker:
    """One ``flowengine worker`` process and the proxy in front of its broker."""

    proc: subprocess.Popen[bytes]
    proxy: faultproxy.FaultProxy
    log_path: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def wait_log(self, text: str) -> None:
        """Wait until the worker logged ``text`` (fails early if it died)."""
        wait_for_log(self.proc, self.log, text)


@dataclass
class ProxiedWorkers:
    """Starts workers on ``url`` (each through its own proxy) and stops them all."""

    url: str
    exchange: str
    topic: str
    records: str
    log_dir: str
    threads: int = 2
    heartbeat_s: float = 0.2
    extra_args: Sequence[str] = ()
    #: The module run as the worker (``-m``): the CLI, or a test launcher.
    module: str = "flowengine"
    extra_env: dict[str, str] = field(default_factory=dict)
    workers: list[ProxiedWorker] = field(default_factory=list)

    def start(self, url_query: str = "", **env_extra: str) -> ProxiedWorker:
        """Start one worker behind a fresh proxy (``url_query``: appended to its URL)."""
        proxy = faultproxy.FaultProxy(faultproxy.port_of(self.url)).start()
        url = proxy.url(self.url) + url_query
        cmd = [
            sys.executable,
            "-m",
            self.module,
            "worker",
            "--url",
            url,
            "--exchange",
            self.exchange,
            "--topic",
            self.topic,
            "--threads",
            str(self.threads),
            "--heartbeat-interval",
            str(self.heartbeat_s),
            "--tasks",
            "tests.reliability.fault_tasks",
            *self.extra_args,
        ]
        log_path = os.path.join(self.log_dir, f"worker-{len(self.workers)}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env(self.records), **self.extra_env, **env_extra},
                cwd=ROOT,
            )
        worker = ProxiedWorker(proc, proxy, log_path)
        self.workers.append(worker)
        return worker

    def terminate(self, worker: ProxiedWorker) -> int:
        """SIGTERM (a warm shutdown); its exit code."""
        worker.proc.send_signal(signal.SIGTERM)
        return worker.proc.wait(STOP_TIMEOUT_S)

    def stop_all(self) -> None:
        proc_utils.stop_processes([w.proc for w in self.workers], STOP_TIMEOUT_S)
        for worker in self.workers:
            worker.proxy.stop()

    def logs(self) -> str:
        return "\n".join(f"--- worker {w.pid} ---\n{w.log()[-4000:]}" for w in self.workers)

    def __enter__(self) -> ProxiedWorkers:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop_all()


class FlowRun:
    """Runs an engine in a thread so the test can break things meanwhile."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FlowRun:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.engine.run()
        except BaseException as e:  # reported by the test's thread
            self.error = e
        finally:
            self.done.set()

    def wait(self, timeout_s: float = FLOW_TIMEOUT_S, logs: Callable[[], str] = str) -> None:
        """Wait (bounded) for the flow; fail with the workers' logs if it did not complete."""
        if not self.done.wait(timeout_s):
            raise AssertionError(f"flow not done in {timeout_s} s\n{logs()}")
        if self.error is not None:
            raise AssertionError(f"flow failed: {self.error!r}\n{logs()}") from self.error
