"""Tasks the short-request tests run: each returns the name of the thread its body ran on."""

from __future__ import annotations

import threading
import time

from flowengine import task

#: Seconds a Named body takes while LONG is set: well past SHORT_BODY_S.
LONG_BODY_S = 0.02

#: Set by a test to make Named bodies long.
LONG = threading.Event()

#: A worker NamedStopper stops when set (by the test).
WORKER = None


class Named(task.Task):
    """Returns its thread's name; takes LONG_BODY_S while LONG is set."""

    def execute(self):
        if LONG.is_set():
            time.sleep(LONG_BODY_S)  # the body's own length, not a synchronisation
        return threading.current_thread().name


class NamedStopper(task.Task):
    """Returns its thread's name, after stopping WORKER when one is set."""

    def execute(self):
        if WORKER is not None:
            WORKER.stop()
        return threading.current_thread().name


#: Set by a test: the next Gated body signals HELD and waits for OPEN.
HOLD_NEXT = threading.Event()
#: Set by a test: the first Gated body of the task of that name does the same.
HOLD_NAME: str | None = None
HELD = threading.Event()
OPEN = threading.Event()
#: Thread name of every Gated body that ran (all workers of the process).
GATED_RUNS: list[str] = []

#: Bound (s) on a held Gated body's wait: only so a bug fails instead of hanging.
GATED_WAIT_S = 30.0


class Gated(task.Task):
    """Returns its thread's name; the body run after HOLD_NEXT was set waits for OPEN."""

    def execute(self):
        global HOLD_NAME
        GATED_RUNS.append(threading.current_thread().name)
        if HOLD_NEXT.is_set() or (HOLD_NAME is not None and HOLD_NAME == self.name):
            HOLD_NEXT.clear()
            HOLD_NAME = None
            HELD.set()
            OPEN.wait(GATED_WAIT_S)
        return threading.current_thread().name
