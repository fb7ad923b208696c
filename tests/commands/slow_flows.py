"""Flows for the interrupt tests of `flowengine run`: each task says when it runs."""

from __future__ import annotations

import sys
import time

from flowengine import task
from flowengine.patterns import linear_flow

#: How long each step runs: long enough for a test to signal the process
#: while the first one runs (the test waits for the step to say it started).
STEP_S = 1.0


class Step(task.Task):
    """Says it started (stdout), works for STEP_S, returns its name."""

    def execute(self) -> str:
        print(f"started {self.name}", file=sys.stderr, flush=True)
        time.sleep(STEP_S)  # the work being interrupted
        return self.name


def three_steps() -> linear_flow.Flow:
    return linear_flow.Flow("slow").add(*[Step(f"s{i}", provides=f"r{i}") for i in range(3)])
