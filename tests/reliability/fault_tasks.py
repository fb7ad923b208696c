"""Tasks the fault tests run on real worker processes; each records its runs.

Every body appends a ``start`` and an ``end`` JSON line (request uuid,
action, attempt, pid, wall time) to the file named by $FLOWENGINE_FAULT_RECORDS,
so the checker can count each request's executions across processes,
including ones killed half way (a start without an end).
"""

from __future__ import annotations

import json
import os
import time

from flowengine import task
from flowengine.engines.worker_based.worker_side import context

#: Environment variable naming the shared records file.
RECORDS_ENV = "FLOWENGINE_FAULT_RECORDS"


def record(event: str, name: str) -> None:
    """Append one record line (one write with O_APPEND: lines never interleave)."""
    ctx = context.current()
    line = (
        json.dumps(
            {
                "ev": event,
                "name": name,
                "uuid": ctx.uuid if ctx else None,
                "action": ctx.action if ctx else None,
                "attempt": ctx.attempt if ctx else None,
                "pid": os.getpid(),
                "t": time.time(),
            }
        )
        + "\n"
    )
    fd = os.open(os.environ[RECORDS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Step(task.Task):
    """Works for ``pause`` seconds (the window in which a worker gets killed)."""

    def execute(self, n: int, pause: float = 0.05) -> int:
        record("start", self.name)
        time.sleep(pause)  # the task's own work, not synchronisation
        record("end", self.name)
        return n


#: Seconds a Work body sleeps at a time: it is Python code between slices, so
#: a fence or a time limit stops it within one slice.
WORK_SLICE_S = 0.02


class Work(task.Task):
    """Works for ``pause`` seconds in short slices; records ``abort`` if stopped."""

    def execute(self, n: int, pause: float) -> int:
        record("start", self.name)
        try:
            deadline = time.monotonic() + pause
            while time.monotonic() < deadline:
                time.sleep(WORK_SLICE_S)  # the task's own work, not synchronisation
        except BaseException:
            record("abort", self.name)
            raise
        record("end", self.name)
        return n


class Blocker(task.Task):
    """Blocks until the test writes a line into the FIFO at ``fifo``."""

    def execute(self, fifo: str) -> str:
        record("start", self.name)
        with open(fifo) as f:  # blocks until the test opens it for writing
            line = f.readline().strip()
        record("end", self.name)
        return line


class Busy(task.Task):
    """Keeps a CPU busy in pure Python for ``seconds`` (holds the GIL most of the time)."""

    def execute(self, seconds: float) -> int:
        record("start", self.name)
        deadline = time.monotonic() + seconds
        spins = 0
        while time.monotonic() < deadline:
            for _ in range(10_000):
                spins += 1
        record("end", self.name)
        return spins


class WhoAmI(task.Task):
    """Returns what the request context tells task code (uuid, action, attempt...)."""

    def execute(self) -> dict:
        ctx = context.current()
        return (
            None
            if ctx is None
            else {
                "uuid": ctx.uuid,
                "action": ctx.action,
                "attempt": ctx.attempt,
                "request_id": ctx.request_id,
                "worker_id": ctx.worker_id,
            }
        )
