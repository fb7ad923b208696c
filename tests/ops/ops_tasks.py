"""Tasks the operations tests run on real workers (importable by name)."""

from __future__ import annotations

import os
import threading
import time

from flowengine import task
from flowengine.engines.worker_based import context

#: Longest a WaitForCancel body waits (s): only bounds a broken test.
WAIT_LIMIT_S = 60.0


class WaitForCancel(task.Task):
    """Runs until its request is cancelled (then raises RequestCancelled)."""

    def execute(self, tag: str = "") -> str:
        ctx = context.current()
        assert ctx is not None, "not run by a worker"
        ctx.cancelled.wait(WAIT_LIMIT_S)
        ctx.raise_if_cancelled()
        return "never cancelled"


class Sleep(task.Task):
    """Sleeps (in a process the worker may kill); returns its pid."""

    def execute(self, seconds: float = WAIT_LIMIT_S) -> int:
        time.sleep(seconds)
        return os.getpid()


class Fails(task.Task):
    """Always fails with ValueError('broken on purpose')."""

    def execute(self) -> None:
        raise ValueError("broken on purpose")


class Quick(task.Task):
    """Returns its argument at once."""

    def execute(self, value: int = 1) -> int:
        return value


#: In-process tests: what Record ran, in order; BLOCK holds a Record(block=True).
RECORDED: list[str] = []
RECORDED_CHANGED = threading.Condition()
BLOCK = threading.Event()
BLOCKED = threading.Event()

#: Seconds each Record body takes: long beside a broker hop (milliseconds),
#: so a loop has its next request in hand when a thread frees.
RECORD_S = 0.2


class Record(task.Task):
    """Appends its tag to RECORDED (with ``block``: sets BLOCKED, waits for BLOCK)."""

    def execute(self, tag: str, block: bool = False) -> str:
        if block:
            BLOCKED.set()
            BLOCK.wait(WAIT_LIMIT_S)
        else:
            time.sleep(RECORD_S)
        with RECORDED_CHANGED:
            RECORDED.append(tag)
            RECORDED_CHANGED.notify_all()
        return tag
