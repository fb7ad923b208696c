"""Flows for the persistence tests, importable by name (factories are saved).

Every task appends its name to an *effects file* when it executes, so a test
can count executions across processes. A task named in the environment
variable ``BLOCK_ENV`` announces ``BLOCKED <name>`` on stdout and then blocks,
so a parent process can kill the engine while that task is running.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from flowengine import task
from flowengine.patterns import linear_flow as lf

#: Environment variable naming the task that must block (crash tests).
BLOCK_ENV = "FLOWENGINE_TEST_BLOCK_IN"
#: A blocked task gives up after this long: the parent kills it far sooner,
#: and an orphaned child must not live forever.
BLOCK_LIMIT_S = 60.0


def record(effects: str, name: str) -> None:
    """Append one execution of ``name`` to the effects file (atomic append)."""
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name}\n".encode())
    finally:
        os.close(fd)


def executions(effects: str) -> dict[str, int]:
    """How many times each task executed, from the effects file."""
    counts: dict[str, int] = {}
    if os.path.exists(effects):
        with open(effects) as fp:
            for line in fp:
                counts[line.strip()] = counts.get(line.strip(), 0) + 1
    return counts


class Step(task.Task):
    """Records its execution, maybe blocks, returns ``sum(inputs) + add``."""

    def __init__(self, name: str, effects: str, add: int, provides: str,
                 requires: tuple[str, ...] = ()) -> None:
        super().__init__(name=name, provides=provides, requires=list(requires))
        self._effects = effects
        self._add = add

    def execute(self, **inputs: Any) -> int:
        record(self._effects, self.name)
        if os.environ.get(BLOCK_ENV) == self.name:
            sys.stdout.write(f"BLOCKED {self.name}\n")
            sys.stdout.flush()
            threading.Event().wait(BLOCK_LIMIT_S)
            raise RuntimeError(f"{self.name} was not killed within {BLOCK_LIMIT_S} s")
        return sum(inputs.values()) + self._add


def make_flow(effects: str) -> lf.Flow:
    """a -> x=1; b -> y=x+10; c -> z=y+100 (z == 111)."""
    return lf.Flow("crashable").add(
        Step("a", effects, 1, "x"),
        Step("b", effects, 10, "y", requires=("x",)),
        Step("c", effects, 100, "z", requires=("y",)),
    )


def make_chain(effects: str, prefix: str, length: int) -> lf.Flow:
    """``length`` tasks in a row, each adding 1 to the previous result."""
    flow = lf.Flow(f"chain-{prefix}")
    previous: tuple[str, ...] = ()
    for i in range(length):
        symbol = f"{prefix}{i}"
        flow.add(Step(f"{prefix}-{i}", effects, 1, symbol, requires=previous))
        previous = (symbol,)
    return flow
