"""Flows for the `flowengine flows` tests, named as module:factory on the command line.

Every task appends its name to a *ledger* file when it executes (and
``revert <name>`` when it reverts), so a test counts executions across
processes. Both values come from the flow's store (``--store ledger=PATH``),
so a resumed or retried run, or a remote worker, gets them too:

- ``ledger``: the ledger file's path;
- ``block``: the name of a task that, on its first execution only, says
  ``BLOCKED <name>`` on stderr and waits (to be killed mid-flow).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from flowengine import retry, task
from flowengine.patterns import linear_flow

#: A blocked task gives up after this long: the test kills its process far
#: sooner, and an orphaned process must not live forever.
BLOCK_LIMIT_S = 60.0
#: Length of the text in the last step's result: longer than `flows show`
#: prints without --full.
LONG_TEXT_CHARS = 150


def record(ledger: str, entry: str) -> None:
    """Append one line to the ledger (one write: atomic between processes)."""
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{entry}\n".encode())
    finally:
        os.close(fd)


def entries(ledger: str) -> list[str]:
    """The ledger's lines, in order."""
    if not os.path.exists(ledger):
        return []
    with open(ledger, encoding="utf-8") as fh:
        return fh.read().splitlines()


class Step(task.Task):
    """Records itself; blocks once if it is the store's ``block``; returns inputs + 1."""

    def execute(self, ledger: str, block: str = "", **inputs: Any) -> int:
        record(ledger, self.name)
        if block == self.name and entries(ledger).count(self.name) == 1:
            print(f"BLOCKED {self.name}", file=sys.stderr, flush=True)
            threading.Event().wait(BLOCK_LIMIT_S)
            raise RuntimeError(f"{self.name} was not killed within {BLOCK_LIMIT_S} s")
        return sum(inputs.values()) + 1

    def revert(self, ledger: str, **kwargs: Any) -> None:
        record(ledger, f"revert {self.name}")


class Report(task.Task):
    """Records itself; returns a dict with a long text (cut by `flows show`)."""

    def execute(self, ledger: str, total: int) -> dict[str, Any]:
        record(ledger, self.name)
        return {"total": total, "text": "x" * LONG_TEXT_CHARS}


class Flaky(task.Task):
    """Fails on its first execution (per ledger), succeeds on the next ones."""

    def execute(self, ledger: str) -> str:
        record(ledger, self.name)
        if entries(ledger).count(self.name) == 1:
            raise ValueError(f"{self.name} fails the first time")
        return "steady"

    def revert(self, ledger: str, **kwargs: Any) -> None:
        record(ledger, f"revert {self.name}")


class BrokenRevert(Step):
    """A step whose revert fails: the flow ends FAILURE instead of REVERTED."""

    def revert(self, ledger: str, **kwargs: Any) -> None:
        record(ledger, f"revert {self.name}")
        raise RuntimeError(f"cannot undo {self.name}")


def steps() -> linear_flow.Flow:
    """a -> b -> c -> report: SUCCESS ({'total': 3, ...})."""
    return linear_flow.Flow("steps").add(
        Step("a", provides="x"),
        Step("b", provides="y", requires=["x"]),
        Step("c", provides="total", requires=["y"]),
        Report("report", provides="report"),
    )


def guarded() -> linear_flow.Flow:
    """A retry around a task failing once: SUCCESS after two attempts."""
    inner = linear_flow.Flow("attempts", retry=retry.Times(3, name="again")).add(
        Flaky("wobbly", provides="wobbly")
    )
    return linear_flow.Flow("guarded").add(Step("a", provides="x"), inner)


def reverting() -> linear_flow.Flow:
    """a then a task failing once: REVERTED (a reverted) the first time."""
    return linear_flow.Flow("reverting").add(Step("a", provides="x"), Flaky("flaky"))


def failing() -> linear_flow.Flow:
    """A step whose revert fails, then a task failing once: FAILURE the first time."""
    return linear_flow.Flow("failing").add(BrokenRevert("a", provides="x"), Flaky("flaky"))


#: A flow object rather than a factory: `flowengine run` can run and save it
#: but records no factory, so `flows resume` cannot rebuild it.
FLOW_OBJECT = linear_flow.Flow("object").add(Step("only"))
