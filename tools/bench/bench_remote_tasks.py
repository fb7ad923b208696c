"""The trivial task the remote benchmarks run (importable by engines and workers).

The same module serves both libraries: ``FLOWENGINE_BENCH_LIB=taskflow`` in the
environment makes ``Noop`` a TaskFlow task, anything else a flowengine task.
"""

from __future__ import annotations

import os

if os.environ.get("FLOWENGINE_BENCH_LIB") == "taskflow":
    from taskflow import task
else:
    from flowengine import task


class Noop(task.Task):
    """Does nothing: what is measured is the engine, the broker and the protocol."""

    def execute(self) -> None:
        return None
