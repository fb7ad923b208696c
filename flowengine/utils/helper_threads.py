"""Daemon threads kept for the next short-lived owner: a started job does not wait to run.

An engine's executor runs a few loops of its own (its reply consumer, its
sender, its housekeeping) for as long as it runs, and a process may start
one engine after another (a conductor's jobs, a service's requests).
``threading.Thread.start`` returns only once the new thread runs, about
half a millisecond each on a busy machine, several per engine start. Here
a job goes to a thread a finished job left idle, if any, without waiting
for it to run; a thread idle for ``IDLE_EXIT_S`` ends. Like those threads
were, every helper is a daemon: a job stuck on a broker cannot keep the
process alive.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable

__all__ = ["IDLE_EXIT_S", "MAX_IDLE", "HelperThreads", "Job", "start"]

LOG = logging.getLogger(__name__)

#: Seconds an idle helper thread waits for its next job before it ends.
IDLE_EXIT_S = 30.0

#: Idle helper threads kept at most; a job that finds none starts one.
MAX_IDLE = 16

#: The name of a helper thread while it waits for a job.
IDLE_NAME = "flowengine-helper-idle"


class Job:
    """One call of a target on a helper thread: join() it as a Thread."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self.target = target
        self.name = name
        self._done = threading.Event()
        self._ident: int | None = None

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the target returned (or raised); False if ``timeout`` passed first."""
        return self._done.wait(timeout)

    def is_alive(self) -> bool:
        """True until the target returned."""
        return not self._done.is_set()

    def is_current(self) -> bool:
        """True when called from within the target (on its thread)."""
        return self._ident == threading.get_ident() and not self._done.is_set()

    def run(self) -> None:
        """Run the target here, once; its exception is logged, not raised."""
        self._ident = threading.get_ident()
        try:
            self.target()
        except BaseException:
            LOG.exception("Helper thread %s ended with an error", self.name)
        finally:
            self._done.set()


class _Helper:
    """A daemon thread running jobs handed to it, one at a time."""

    _numbers = itertools.count(1)

    def __init__(self, threads: HelperThreads, job: Job) -> None:
        self._threads = threads
        self.job: Job | None = job
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"{IDLE_NAME}-{next(self._numbers)}")

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            job = self.job
            if job is None:
                return
            me.name = job.name
            job.run()
            me.name = IDLE_NAME
            if not self._threads.idle(self):
                return
            self.wake.wait(self._threads.idle_exit_s)
            if not self._threads.claim_or_leave(self):
                return


class HelperThreads:
    """Runs each job on a daemon thread, reusing idle ones (see the module docstring)."""

    def __init__(self, idle_exit_s: float = IDLE_EXIT_S, max_idle: int = MAX_IDLE) -> None:
        self.idle_exit_s = idle_exit_s
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[_Helper] = []

    def start(self, target: Callable[[], None], name: str) -> Job:
        """Run ``target`` on a helper thread named ``name`` while it runs; at once."""
        job = Job(target, name)
        with self._lock:
            helper = self._idle.pop() if self._idle else None
            if helper is not None:
                # Given under the lock: the helper cannot time out meanwhile
                # (claim_or_leave takes it too).
                helper.job = job
                helper.wake.set()
                return job
        _Helper(self, job).thread.start()
        return job

    @property
    def idle_count(self) -> int:
        """Helper threads waiting for a job now."""
        with self._lock:
            return len(self._idle)

    def idle(self, helper: _Helper) -> bool:
        """``helper`` finished its job: keep it for the next (False: it ends)."""
        with self._lock:
            helper.job = None
            helper.wake.clear()
            if len(self._idle) >= self._max_idle:
                return False
            self._idle.append(helper)
            return True

    def claim_or_leave(self, helper: _Helper) -> bool:
        """After a wait: True when ``helper`` was given a job, else it leaves the idle ones."""
        with self._lock:
            if helper.job is not None:
                return True
            self._idle.remove(helper)
            return False


_HELPERS = HelperThreads()


def _forget_in_child() -> None:
    # A forked child has none of its parent's threads.
    global _HELPERS
    _HELPERS = HelperThreads()


os.register_at_fork(after_in_child=_forget_in_child)


def start(target: Callable[[], None], name: str) -> Job:
    """Run ``target`` on one of this process's helper threads (see HelperThreads.start)."""
    return _HELPERS.start(target, name)
