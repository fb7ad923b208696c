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
