"""Task classes the worker-side tests serve (importable by name)."""

from __future__ import annotations

import threading

from flowengine import task

#: Set by tests to release BlockingTask executions.
RELEASE = threading.Event()
#: Set by BlockingTask when it starts running.
STARTED = threading.Event()


class Add(task.Task):
    """Adds x and y."""

    def execute(self, x, y):
        return x + y


class Fail(task.Task):
    """Always raises RuntimeError('Woot!'); its revert records what it got."""

    def execute(self, **kwargs):
        raise RuntimeError("Woot!")

    def revert(self, result=None, flow_failures=None, **kwargs):
        return {"result_type": type(result).__name__, "failures": sorted(flow_failures or {})}


class Progress(task.Task):
    """Reports progress 0.5 then 1.0 and returns 'done'."""

    def execute(self):
        self.update_progress(0.5)
        self.update_progress(1.0)
        return "done"


class Unserialisable(task.Task):
    """Returns an object JSON cannot encode."""

    def execute(self):
        return object()


class BadFailure(task.Task):
    """Raises an exception whose args cannot be encoded."""

    def execute(self):
        raise ValueError(object())


class Blocking(task.Task):
    """Blocks until RELEASE is set (bounded), then returns 1."""

    def execute(self):
        STARTED.set()
        RELEASE.wait(10)
        return 1


class NeedsArg(task.Task):
    """Cannot be built from a name alone."""

    def __init__(self, needed, name=None):
        super().__init__(name=name)
        self.needed = needed

    def execute(self):
        return self.needed


class _Helper:
    """Not a task: must never be served."""


class Huge(task.Task):
    """Returns a result larger than any message may be."""

    def execute(self):
        from flowengine.engines.worker_based import protocol

        return "h" * (protocol.MAX_BODY_BYTES + 1)
