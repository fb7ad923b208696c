"""Tasks the real-worker-process pools serve besides the behaviour suite's."""

from __future__ import annotations

import os

from flowengine import task


class WhereAmI(task.Task):
    """Returns the id of the process that ran it."""

    def execute(self) -> int:
        return os.getpid()
