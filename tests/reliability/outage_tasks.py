"""Tasks the outage and signing fault tests run in real worker processes.

Each run of a task body appends one line (its token) to a ledger file, so a
test can count how many times each request's body really ran.
"""

from __future__ import annotations

import os
import time

from flowengine import task


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
        if delay:
            time.sleep(delay)  # the work itself, not synchronisation
        append_line(path, token)
        return token
