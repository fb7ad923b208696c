"""A task the thread-inventory tests hold running while they count threads."""

from __future__ import annotations

import threading

from flowengine import task

#: Bound (s) on every wait here: only so that a bug fails instead of hanging.
WAIT_S = 10.0

#: Notified each time a Hold starts; guards STARTED.
CHANGED = threading.Condition()
#: How many Hold bodies started since reset().
STARTED = 0
#: Set by the test to let every Hold body return.
RELEASE = threading.Event()


def reset() -> None:
    """Forget earlier runs: nothing started, nothing released."""
    global STARTED
    with CHANGED:
        STARTED = 0
    RELEASE.clear()


def wait_started(count: int) -> bool:
    """Wait until ``count`` Hold bodies are running (bounded)."""
    with CHANGED:
        return CHANGED.wait_for(lambda: STARTED >= count, WAIT_S)


class Hold(task.Task):
    """Runs until RELEASE is set (bounded), then returns 1."""

    def execute(self):
        global STARTED
        with CHANGED:
            STARTED += 1
            CHANGED.notify_all()
        RELEASE.wait(WAIT_S)
        return 1


#: The worker StopsItsWorker stops (set by the test).
WORKER = None


class StopsItsWorker(task.Task):
    """Stops the worker it runs on (WORKER), then returns 1."""

    def execute(self):
        WORKER.stop()
        return 1
