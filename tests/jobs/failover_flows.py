"""Flows for the Redis failover test: each run of a job is counted, one job waits at a gate.

Importable by name (a conductor rebuilds a job's flow from its factory's
module and name); the conductor runs in the test process, so the counts
are plain module state, reset by the test.
"""

from __future__ import annotations

import collections
import threading

from flowengine import task
from flowengine.patterns import linear_flow as lf

#: Completed runs per job label.
RUNS: collections.Counter[str] = collections.Counter()
_RUNS_LOCK = threading.Lock()
#: Opened by the test to let the gated job finish.
GATE = threading.Event()
#: Set when the gated job has started (its conductor is mid-job).
AT_GATE = threading.Event()
#: Bound on the gate: a test that never opens it fails instead of hanging.
GATE_WAIT_S = 90.0


def reset() -> None:
    """Forget the counts, close the gate."""
    with _RUNS_LOCK:
        RUNS.clear()
    GATE.clear()
    AT_GATE.clear()


class Count(task.Task):
    """Counts one completed run of the job named by ``label``."""

    def execute(self, label: str) -> str:
        with _RUNS_LOCK:
            RUNS[label] += 1
        return label


class Gate(task.Task):
    """Holds its job until the test opens GATE (bounded)."""

    def execute(self) -> None:
        AT_GATE.set()
        GATE.wait(GATE_WAIT_S)


def counted_factory() -> lf.Flow:
    return lf.Flow("counted").add(Count("count"))


def gated_factory() -> lf.Flow:
    return lf.Flow("gated").add(Gate("gate"), Count("count"))
