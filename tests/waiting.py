"""The tests' one bounded wait for a condition nothing signals.

Some conditions can only be looked at: another process's state, a broker's
or a database's, a log file. A test polls them here, with a bound so that a
condition that never comes fails the test instead of hanging it. A condition
the code under test signals (an event, a future, a notifier) is waited on
directly, never polled.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["POLL_S", "WAIT_S", "holds_within", "thread_stacks", "wait_until"]

#: Default bound (s): far beyond what a passing test needs on a loaded
#: 2-core CI machine; it only decides how long a failing one takes.
WAIT_S = 60.0

#: Default pause between two looks (s).
POLL_S = 0.01


def _first_truthy(predicate: Callable[[], Any], timeout: float, poll_s: float) -> Any:
    """``predicate()``'s first truthy value within ``timeout`` s, else its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(poll_s)


def wait_until(
    predicate: Callable[[], Any], what: str, timeout: float = WAIT_S, poll_s: float = POLL_S
) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that.

    Fails (AssertionError naming ``what``) once ``timeout`` s passed.
    """
    value = _first_truthy(predicate, timeout, poll_s)
    if not value:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return value


def holds_within(
    predicate: Callable[[], Any], timeout: float = WAIT_S, poll_s: float = POLL_S
) -> bool:
    """Whether ``predicate`` returned something truthy within ``timeout`` s.

    For ``assert holds_within(...), details`` where the failure message
    needs what only the test has (a process's logs, say).
    """
    return bool(_first_truthy(predicate, timeout, poll_s))


def thread_stacks() -> str:
    """What each thread of this process is doing, for a failure message (a stuck loop shows)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "".join(
        f"--- thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame)[-8:])
        for ident, frame in sys._current_frames().items()
    )
