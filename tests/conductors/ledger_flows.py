"""Flows for the conductor fault tests: every task body writes to a ledger file.

Each record is one JSON line: ``{"job": ..., "task": ..., "pid": ...,
"ev": "start"|"end", "t": ...}``, appended with one ``write`` on an
``O_APPEND`` file (whole lines, even from several processes). The checker
(``checker.py``) counts from them what ran once, twice, or never.
Inputs (job store): ``ledger`` (path), ``job`` (a key for the checker),
``delay`` (seconds the slow task sleeps), ``poison`` (the task kills its own
conductor with SIGKILL, every time).
"""

from __future__ import annotations

import json
import os
import signal
import time

from flowengine import task
from flowengine.patterns import linear_flow as lf


def record(ledger: str, job: str, name: str, ev: str) -> None:
    """Append one record to the ledger."""
    line = (
        json.dumps({"job": job, "task": name, "pid": os.getpid(), "ev": ev, "t": time.time()})
        + "\n"
    )
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Step(task.Task):
    """Records start, sleeps ``delay`` if it is the slow one, records end."""

    def __init__(self, name: str, slow: bool = False) -> None:
        super().__init__(name=name)
        self._slow = slow

    def execute(self, ledger: str, job: str, delay: float = 0.0) -> dict:
        record(ledger, job, self.name, "start")
        if self._slow and delay:
            time.sleep(delay)
        record(ledger, job, self.name, "end")
        return {"pid": os.getpid()}


class Poison(task.Task):
    """Kills the conductor running it, every time."""

    def execute(self, ledger: str, job: str) -> None:
        record(ledger, job, self.name, "start")
        os.kill(os.getpid(), signal.SIGKILL)


def chain_factory() -> lf.Flow:
    """t0 -> t1 (slow) -> t2."""
    return lf.Flow("chain").add(Step("t0"), Step("t1", slow=True), Step("t2"))


def short_factory() -> lf.Flow:
    """One quick task."""
    return lf.Flow("short").add(Step("t0"))


def poison_factory() -> lf.Flow:
    """A task that kills its conductor."""
    return lf.Flow("poison").add(Step("t0"), Poison("p"))


def backwards_factory() -> lf.Flow:
    """c -> b -> a: execution order is not the names' order."""
    return lf.Flow("backwards").add(Step("c"), Step("b"), Step("a"))
