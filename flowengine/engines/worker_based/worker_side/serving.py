"""The threads a worker serves in: one consume loop per topic, and control requests.

Each loop is a plain loop (receive, check, acknowledge, hand the request to
the worker's pool) in a daemon thread named after its role
(``flowengine-consume-<topic>``, ``flowengine-control-<worker id>``), as
Dramatiq runs one consumer thread per queue. The thread that called
``Worker.run()`` only waits for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

LOG = logging.getLogger(__name__)

__all__ = ["ServingThreads"]


class ServingThreads:
    """Runs each of a worker's loops in a named thread; says when the first one ended.

    A loop returns only once it was asked to stop; one that raises instead
    is remembered (:meth:`wait_first` returns its error) so that the worker
    can stop the others and report it.
    """

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._first_ended = threading.Event()
        self._error: BaseException | None = None

    def start(self, loops: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Start one daemon thread per ``(thread name, loop)``."""
        for name, loop in loops:
            thread = threading.Thread(target=self._run, args=(loop,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as e:
            LOG.exception("%s ended on an error", threading.current_thread().name)
            if self._error is None:
                self._error = e
        finally:
            self._first_ended.set()

    def wait_first(self) -> BaseException | None:
        """Block until a loop ended; what it raised (None: it was stopped)."""
        self._first_ended.wait()
        return self._error

    def runs_here(self) -> bool:
        """Whether the calling thread is one of the loops' (e.g. running a short request)."""
        return threading.current_thread() in self._threads

    def join(self, timeout_s: float) -> bool:
        """Wait until every loop's thread ended, ``timeout_s`` at most; True if they all did.

        The calling thread is not waited for when it is one of them (a loop
        that stops its own worker).
        """
        deadline = time.monotonic() + timeout_s
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads if t is not current)
