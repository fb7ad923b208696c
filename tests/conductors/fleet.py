"""Real conductor processes (``flowengine conductor``) for the fault tests.

:class:`Fleet` starts conductors on one board and one persistence store,
each logging to its own file, kills or pauses them on request, restarts the
dead ones (a supervisor, as production would run), and stops them all at
the end. :func:`post` posts a ledger flow from the test process.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from flowengine import engines
from flowengine.persistence import models
from flowengine.utils import persistence_utils as p_utils

#: A conductor starts in ~1 s (imports, connect); 30 s means it is broken.
START_TIMEOUT_S = 30.0
#: SIGTERM to exit: it abandons its jobs at once, so this is short.
STOP_TIMEOUT_S = 15.0
#: Between two looks at a log file while waiting for a line to appear.
POLL_S = 0.05
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Conductor:
    """One conductor process."""

    name: str
    proc: subprocess.Popen
    log_path: str
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Fleet:
    """Conductor processes on ``board_url`` + ``persistence_url``."""

    workdir: str
    board_url: str
    persistence_url: str
    lease_s: float
    extra: list[str] = field(default_factory=list)
    members: list[Conductor] = field(default_factory=list)
    _count: int = 0

    def start(self, concurrency: int = 1, wait: bool = True) -> Conductor:
        """Start one conductor; wait until it is ready (unless told not to)."""
        self._count += 1
        name = f"c{self._count}"
        log_path = os.path.join(self.workdir, f"{name}.log")
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p),
        )
        cmd = [
            sys.executable,
            "-m",
            "flowengine",
            "conductor",
            "--board",
            self.board_url,
            "--persistence",
            self.persistence_url,
            "--name",
            name,
            "--concurrency",
            str(concurrency),
            "--board-option",
            f"lease_s={self.lease_s}",
            *self.extra,
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        member = Conductor(name, proc, log_path)
        self.members.append(member)
        if wait:
            self.wait_log(member, "ready on board")
        return member

    def wait_log(
        self, member: Conductor, pattern: str, timeout_s: float = START_TIMEOUT_S
    ) -> re.Match:
        """Wait (bounded) for a line matching ``pattern`` in the member's log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, member.log())
            if found:
                return found
            if not member.alive() and not re.search(pattern, member.log()):
                raise AssertionError(
                    f"{member.name} exited ({member.proc.returncode})"
                    f" before logging {pattern!r}:\n{member.log()[-3000:]}"
                )
            time.sleep(POLL_S)
        raise AssertionError(
            f"{member.name} did not log {pattern!r} in {timeout_s} s:\n{member.log()[-3000:]}"
        )

    def by_pid(self, pid: int) -> Conductor:
        return next(m for m in self.members if m.pid == pid)

    def kill(self, member: Conductor, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the member's process group (SIGKILL marks it killed)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(member.pid, sig)
        if sig == signal.SIGKILL:
            member.killed = True
            member.proc.wait(STOP_TIMEOUT_S)

    def killed_pids(self) -> set[int]:
        return {
            m.pid
            for m in self.members
            if m.killed or (m.proc.poll() is not None and m.proc.returncode < 0)
        }

    def replace_dead(self, keep: int, concurrency: int = 1) -> None:
        """Start new conductors until ``keep`` are alive (the supervisor)."""
        while sum(1 for m in self.members if m.alive()) < keep:
            self.start(concurrency=concurrency, wait=False)

    def stop(self) -> None:
        """SIGTERM every live member (SIGCONT first, in case it is paused); then kill."""
        for m in self.members:
            if m.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(m.pid, signal.SIGCONT)
                    os.killpg(m.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for m in self.members:
            try:
                m.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(m.pid, signal.SIGKILL)
                m.proc.wait(STOP_TIMEOUT_S)

    def wait_consumed(self, uuids: set[str], timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait (bounded) until a live or exited member logged consuming each of ``uuids``.

        The board shows an outcome a moment before its conductor logs it.
        """
        deadline = time.monotonic() + timeout_s
        while not uuids <= set(self.consumed_lines()) and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def consumed_lines(self) -> dict[str, list[str]]:
        """Job uuid -> names of the conductors that logged consuming it."""
        out: dict[str, list[str]] = {}
        for m in self.members:
            for uuid in re.findall(r"job_consumed (\S+)", m.log()):
                out.setdefault(uuid, []).append(m.name)
        return out


def post(
    board: Any, persistence: Any, factory: Any, store: dict[str, Any], name: str = "job"
) -> Any:
    """Save ``factory`` and ``store`` to persistence and post a job running them."""
    book = models.LogBook(name)
    flow = factory()
    fd = p_utils.create_flow_detail(flow, book=book, backend=persistence)
    engines.save_factory_details(fd, factory, [], {}, backend=persistence)
    return board.post(name, book, details={"flow_uuid": fd.uuid, "store": store})
