"""Tasks for the time-limit and shutdown fault tests; each writes what it does to a ledger.

The ledger (``<folder>/ledger.jsonl``) gets one JSON line per event, written
with a single O_APPEND write (atomic for lines this short), so the test can
wait on it and its checker can count each request's runs.
"""

from __future__ import annotations

import json
import os
import time

from flowengine import exceptions as exc
from flowengine import task

#: Seconds between two looks at the release file while a gated task waits
#: (the body waits for the test's signal; this only sets how soon it notices).
GATE_POLL_S = 0.01

#: Seconds a gated or blocking body waits at most before failing (bounds a
#: broken test instead of hanging a worker).
GATE_TIMEOUT_S = 60.0


def record(folder: str, name: str, event: str, **extra: object) -> None:
    """Append one event line to the ledger in ``folder``."""
    line = (
        json.dumps(
            {"task": name, "event": event, "pid": os.getpid(), "ppid": os.getppid(), **extra}
        )
        + "\n"
    )
    fd = os.open(os.path.join(folder, "ledger.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_ledger(folder: str) -> list[dict]:
    """Every event recorded so far."""
    try:
        with open(os.path.join(folder, "ledger.jsonl"), encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def _wait_released(folder: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(os.path.join(folder, "release")):
        if time.monotonic() > deadline:
            raise RuntimeError("the test never released this task")
        time.sleep(GATE_POLL_S)


class Echo(task.Task):
    """Returns its input at once."""

    def execute(self, folder: str, value: int = 0) -> int:
        record(folder, self.name, "start")
        record(folder, self.name, "end")
        return value


class Blocker(task.Task):
    """Starts, then blocks (in Python, sleeping) until stopped; never returns on its own."""

    def execute(self, folder: str) -> None:
        record(folder, self.name, "start")
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while time.monotonic() < deadline:
            time.sleep(GATE_POLL_S)
        record(folder, self.name, "end")
        raise RuntimeError("nobody stopped this blocking task")


class SoftCatcher(task.Task):
    """Blocks until its soft limit fires, then cleans up and returns normally."""

    def execute(self, folder: str) -> str:
        record(folder, self.name, "start")
        try:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while time.monotonic() < deadline:
                time.sleep(GATE_POLL_S)
        except exc.SoftTimeLimitExceeded:
            record(folder, self.name, "soft-limit")
            return "cleaned up after the soft limit"
        record(folder, self.name, "end")
        return "never interrupted"


class Progressing(task.Task):
    """Reports progress twice, then returns its pid."""

    def execute(self, folder: str) -> int:
        record(folder, self.name, "start")
        self.update_progress(0.25)
        self.update_progress(0.75)
        record(folder, self.name, "end")
        return os.getpid()


class Suicide(task.Task):
    """Ends its own process without a word (as a segfault would)."""

    def execute(self, folder: str) -> None:
        record(folder, self.name, "start")
        os._exit(3)


class Gated(task.Task):
    """Starts, waits until the test creates ``<folder>/release``, returns its name."""

    def execute(self, folder: str) -> str:
        record(folder, self.name, "start")
        _wait_released(folder)
        record(folder, self.name, "end")
        return self.name
