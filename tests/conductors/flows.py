"""Flow factories for the conductor tests (importable by name, as conductors need)."""

from __future__ import annotations

import threading
import time

from flowengine import exceptions as exc
from flowengine import task
from flowengine.patterns import linear_flow as lf

#: Set by tests to release the `Gate` task; cleared by them before use.
GATE = threading.Event()
#: Set by the `Gate` task when it starts.
AT_GATE = threading.Event()


class Ok(task.Task):
    def execute(self) -> int:
        return 1


class Boom(task.Task):
    def execute(self) -> None:
        raise RuntimeError("boom")


class NeedsXYZ(task.Task):
    def execute(self, x, y, z) -> dict:
        return {"x": x, "y": y, "z": z}


class StorageDown(task.Task):
    """Fails the way a transient infrastructure fault does (not consumed)."""

    def execute(self) -> None:
        raise exc.ExecutionFailure("the database is down")


class Gate(task.Task):
    """Blocks until the test opens GATE (bounded)."""

    def execute(self) -> str:
        AT_GATE.set()
        GATE.wait(30)
        time.sleep(0.05)
        return "passed"


def ok_factory():
    return lf.Flow("ok").add(Ok("a"), Ok("b"))


def boom_factory():
    return lf.Flow("boom").add(Ok("a"), Boom("b"))


def store_factory():
    return lf.Flow("store").add(NeedsXYZ("t", provides="xyz"))


def down_factory():
    return lf.Flow("down").add(StorageDown("t"))


def gate_factory():
    return lf.Flow("gate").add(Gate("g"), Ok("after"))
