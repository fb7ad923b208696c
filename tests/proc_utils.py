"""Stopping the child processes tests start (workers, engines, receivers)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable


def stop_processes(procs: Iterable[subprocess.Popen], timeout_s: float) -> None:
    """SIGTERM every live process, then kill those still running after ``timeout_s``.

    The processes share one deadline (they stop in parallel), so stopping N of
    them takes at most ``timeout_s`` plus the kills, not N times that.
    """
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
