"""Tasks of the poison-message tests (test_poison_messages.py): a gate and an adder.

Served by worker processes as ``tests.worker_based.poison_tasks`` (the
repository root on their path), so engine and worker name them alike.
"""

from __future__ import annotations

import os
import time

from flowengine import task

#: Seconds between two looks at the release file while a gate waits.
GATE_POLL_S = 0.01

#: Longest wait (s) of a gate: bounds a broken test instead of hanging a worker.
GATE_TIMEOUT_S = 90.0


def started_path(folder: str, gate: str) -> str:
    """The file a gate writes once it runs."""
    return os.path.join(folder, f"{gate}.started")


def release(folder: str, gate: str) -> None:
    """Let gate ``gate`` of ``folder`` return."""
    with open(os.path.join(folder, gate), "w", encoding="utf-8"):
        pass


class Gate(task.Task):
    """Says it runs, then waits until the test creates ``<folder>/<gate>``; returns ``base``."""

    def execute(self, folder: str, gate: str, base: int) -> int:
        with open(started_path(folder, gate), "w", encoding="utf-8"):
            pass
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not os.path.exists(os.path.join(folder, gate)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate {gate!r} was never released")
            time.sleep(GATE_POLL_S)
        return base


class AddTo(task.Task):
    """Returns ``start + n``."""

    def execute(self, start: int, n: int) -> int:
        return start + n
