"""Tasks the outage and signing fault tests run in real worker processes.

Each run of a task body appends one line (its token) to a ledger file, so a
test can count how many times each request's body really ran; Mark also
writes start/end records (``<ledger>.runs``, checker.py's format) so a test
can tell a re-run after the first ended from two runs at once.
"""

from __future__ import annotations

import json
import os
import time

from flowengine import task
from flowengine.engines.worker_based.worker_side import context


def append_line(path: str, line: str) -> None:
    """Append one line atomically (O_APPEND, one write) so processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)


class Mark(task.Task):
    """Takes ``delay`` seconds (a slow task body), then records ``token`` in ``path``."""

    def execute(self, token: str, path: str, delay: float = 0.0) -> str:
        _run_record(path, "start", token)
        if delay:
            time.sleep(delay)  # the work itself, not synchronisation
        append_line(path, token)
        _run_record(path, "end", token)
        return token


def _run_record(path: str, event: str, token: str) -> None:
    """One start/end line in ``<path>.runs`` (read by tests/reliability/checker.py)."""
    ctx = context.current()
    append_line(
        path + ".runs",
        json.dumps(
            {
                "ev": event,
                "name": token,
                "pid": os.getpid(),
                "t": time.time(),
                "attempt": ctx.attempt if ctx else None,
                "action": ctx.action if ctx else None,
            }
        ),
    )
