"""Flows for the persistence tests, importable by name (factories are saved).

Every task appends its name to an *effects file* when it executes, so a test
can count executions across processes. A task named in the environment
variable ``BLOCK_ENV`` announces ``BLOCKED <name>`` on stdout and then blocks
(on its first execution only), so a parent process can kill the engine while
that task is running.
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
    """Records its execution, maybe blocks, returns ``sum(inputs) + add``.

    Everything it needs arrives as arguments (``effects`` and ``add`` are
    injected), so a remote worker can build it from its name alone.
    """

    def execute(self, effects: str, add: int, **inputs: Any) -> int:
        record(effects, self.name)
        # Block on the first execution only: the resumed run must get through.
        if os.environ.get(BLOCK_ENV) == self.name and executions(effects).get(self.name) == 1:
            sys.stdout.write(f"BLOCKED {self.name}\n")
            sys.stdout.flush()
            threading.Event().wait(BLOCK_LIMIT_S)
            raise RuntimeError(f"{self.name} was not killed within {BLOCK_LIMIT_S} s")
        return sum(inputs.values()) + add


def _step(name: str, effects: str, add: int, provides: str, requires: tuple[str, ...] = ()) -> Step:
    return Step(
        name=name,
        provides=provides,
        requires=list(requires),
        inject={"effects": effects, "add": add},
    )


def make_flow(effects: str) -> lf.Flow:
    """a -> x=1; b -> y=x+10; c -> z=y+100 (z == 111)."""
    return lf.Flow("crashable").add(
        _step("a", effects, 1, "x"),
        _step("b", effects, 10, "y", requires=("x",)),
        _step("c", effects, 100, "z", requires=("y",)),
    )


def make_chain(effects: str, prefix: str, length: int) -> lf.Flow:
    """``length`` tasks in a row, each adding 1 to the previous result."""
    flow = lf.Flow(f"chain-{prefix}")
    previous: tuple[str, ...] = ()
    for i in range(length):
        symbol = f"{prefix}{i}"
        flow.add(_step(f"{prefix}-{i}", effects, 1, symbol, requires=previous))
        previous = (symbol,)
    return flow
