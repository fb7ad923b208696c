"""Real worker processes for the fault tests: start, kill -9, stop; broker options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from tests import proc_utils

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds between heartbeats in the fault tests: short, so that a kill is
#: detected in a fraction of a second and the suite stays fast.
HEARTBEAT_S = 0.2

#: Heartbeats a request may miss before it is lost: more than the default 3
#: because the whole suite shares two cores with other suites, and a late
#: heartbeat would fake a death (1 s at HEARTBEAT_S).
MISSES = 5

#: Bounded waits (s), only so that a broken setup fails instead of hanging.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass
class Conn:
    """How worker processes and the test's executor reach one broker."""

    kind: str
    url: str | None = None
    transport: str | None = None
    transport_options: dict[str, Any] = field(default_factory=dict)

    def cli_args(self) -> list[str]:
        args: list[str] = []
        if self.url:
            args += ["--url", self.url]
        if self.transport:
            args += ["--transport", self.transport]
        for key, value in self.transport_options.items():
            args += ["--transport-option", f"{key}={json.dumps(value)}"]
        return args

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.url:
            out["url"] = self.url
        if self.transport:
            out["transport"] = self.transport
        if self.transport_options:
            out["transport_options"] = dict(self.transport_options)
        return out


def env(records: str) -> dict[str, str]:
    """Environment for worker processes: our sources first, the records file named."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, FLOWENGINE_FAULT_RECORDS=records)


class Workers:
    """``flowengine worker`` processes serving tests.reliability.fault_tasks."""

    def __init__(
        self,
        conn: Conn,
        exchange: str,
        topic: str,
        records: str,
        log_dir: str,
        threads: int = 2,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.conn = conn
        self.exchange = exchange
        self.topic = topic
        self.records = records
        self.log_dir = log_dir
        self.threads = threads
        self.heartbeat_s = heartbeat_s
        self.procs: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
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
            str(self.threads),
            "--heartbeat-interval",
            str(self.heartbeat_s),
            "--tasks",
            "tests.reliability.fault_tasks",
            *self.conn.cli_args(),
        ]
        log = open(os.path.join(self.log_dir, f"worker-{len(self.procs)}.log"), "wb")
        with log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env(self.records), cwd=ROOT
            )
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen) -> None:
        """kill -9: no goodbye, no replies, nothing flushed."""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)

    def stop_all(self) -> None:
        proc_utils.stop_processes(self.procs, STOP_TIMEOUT_S)

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(self.log_dir)):
            with open(os.path.join(self.log_dir, name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)
