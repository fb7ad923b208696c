"""Task classes the event-stream tests serve (importable by worker processes)."""

from __future__ import annotations

import os

from flowengine import task


class Step(task.Task):
    """Returns its input plus one, reporting progress half-way."""

    def execute(self, value: int) -> int:
        self.update_progress(0.5)
        return value + 1


class FailOnce(task.Task):
    """Fails the first time (creating ``marker``), succeeds once ``marker`` exists."""

    def execute(self, marker: str) -> str:
        if not os.path.exists(marker):
            with open(marker, "w"):
                pass
            raise RuntimeError("first attempt fails")
        return "second attempt"


class Boom(task.Task):
    """Always fails."""

    def execute(self) -> None:
        raise RuntimeError("boom")
