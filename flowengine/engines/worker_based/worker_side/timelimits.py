"""How a worker enforces a task's time limits on its threads.

With processes (a forked child per task, see :mod:`.forked`) the hard limit
kills the child. With threads (:class:`ThreadRunner`, the default) nothing
can kill a thread: both limits raise an exception inside the task's thread at
its next Python instruction, so a body blocked in one long C call (a socket
read without a timeout) only notices when that call returns; the request
keeps running and heartbeating meanwhile, and is never reported finished
while its body runs. Where limits come from: :mod:`..wire.timelimits`.
"""

from __future__ import annotations

import ctypes
import functools
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire.timelimits import TimeLimits
from flowengine.engines.worker_based.worker_side.endpoint import Endpoint, ProgressCallback
from flowengine.task import BaseTask
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)


class _Alarms:
    """One daemon thread firing callbacks at deadlines (no thread per request).

    The thread runs while an alarm is pending and ends once none is (a
    worker that stopped leaves no alarm thread behind); the next alarm
    starts it again.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, delay_s: float, callback: Callable[[], None]) -> int:
        """Call ``callback`` (on the alarm thread) in ``delay_s`` seconds; return an id."""
        with self._cond:
            alarm_id = next(self._ids)
            heapq.heappush(self._heap, (time.monotonic() + delay_s, alarm_id, callback))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="flowengine-timelimits"
                )
                self._thread.start()
            self._cond.notify()
        return alarm_id

    def cancel(self, alarm_id: int) -> None:
        """Forget an alarm (no effect once it fired)."""
        with self._cond:
            for i, entry in enumerate(self._heap):
                if entry[1] == alarm_id:
                    self._heap[i] = self._heap[-1]
                    self._heap.pop()
                    heapq.heapify(self._heap)
                    self._cond.notify()  # the thread may end, or wait for another
                    return

    def join_if_idle(self, timeout_s: float) -> bool:
        """With no alarm pending, wait for the thread to end (``timeout_s`` at most).

        True when no alarm thread runs any more; False at once while alarms
        are pending (another worker's bodies may still run).
        """
        with self._cond:
            thread = self._thread
            if thread is None:
                return True
            if self._heap:
                return False
        thread.join(timeout_s)
        return not thread.is_alive()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    if not self._heap:
                        self._thread = None  # under the lock: schedule() starts another
                        return
                    self._cond.wait(self._heap[0][0] - time.monotonic())
                _, _, callback = heapq.heappop(self._heap)
            try:
                callback()
            except Exception:
                LOG.exception("Time limit alarm failed")


_ALARMS = _Alarms()


def join_alarm_thread(timeout_s: float) -> bool:
    """Wait until the time-limit thread ended, when no time limit is pending; see _Alarms."""
    return _ALARMS.join_if_idle(timeout_s)


def _raise_in_thread(thread_id: int, error_cls: type[BaseException]) -> bool:
    """Ask CPython to raise ``error_cls`` in thread ``thread_id`` at its next instruction."""
    # The number of thread states modified: 1 when the thread exists.
    modified: int = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(error_cls)
    )
    return modified == 1


def _clear_in_thread(thread_id: int) -> None:
    """Withdraw an exception asked for by _raise_in_thread that has not fired yet."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)


class _Interruption:
    """The limits of one body running in one thread, and whether they fired."""

    def __init__(self, thread_id: int, what: str, limits: TimeLimits) -> None:
        self.thread_id = thread_id
        self.what = what
        self.limits = limits
        self.lock = threading.Lock()
        self.done = False
        self.fired: str | None = None

    def fire(self, kind: str) -> None:
        with self.lock:
            if self.done:
                return
            self.fired = kind
            if kind == "soft":
                LOG.warning(
                    "%s exceeded its soft time limit of %g s: raising SoftTimeLimitExceeded in it",
                    self.what,
                    self.limits.soft,
                )
                _raise_in_thread(self.thread_id, exc.SoftTimeLimitExceeded)
            else:
                LOG.warning(
                    "%s exceeded its hard time limit of %g s: a thread cannot be"
                    " killed, so TimeLimitExceeded is raised in it at its next Python"
                    " instruction (use the process executor to kill it)",
                    self.what,
                    self.limits.hard,
                )
                _raise_in_thread(self.thread_id, exc.TimeLimitExceeded)

    def finish(self) -> None:
        with self.lock:
            self.done = True
            if self.fired is not None:
                _clear_in_thread(self.thread_id)


class Stopper:
    """Stops one body running in one thread (a fenced request), at most once.

    :meth:`finish` (called when the body returned) withdraws an exception
    not delivered yet, so it never lands in code after the body.
    """

    def __init__(self, thread_id: int, what: str) -> None:
        self.thread_id = thread_id
        self.what = what
        self._lock = threading.Lock()
        self._done = False
        self._fired = False

    def stop(self) -> bool:
        """Raise RequestFenced in the body's thread; False if it already returned."""
        with self._lock:
            if self._done or self._fired:
                return False
            self._fired = _raise_in_thread(self.thread_id, exc.RequestFenced)
            return self._fired

    def finish(self) -> None:
        with self._lock:
            self._done = True
            if self._fired:
                _clear_in_thread(self.thread_id)


def call_endpoint(
    endpoint: Endpoint, task: BaseTask, work: pr.WorkUnit, progress: ProgressCallback | None
) -> Any:
    """Run the request's action through its endpoint in this thread (result or Failure)."""
    method = endpoint.execute if work.action == pr.EXECUTE else endpoint.revert
    return method(task, progress_callback=progress, **work.arguments)


class ThreadRunner:
    """Runs a task body in the calling (pool) thread, enforcing limits by interruption."""

    kind = "threads"

    def run(
        self,
        endpoint: Endpoint,
        task: BaseTask,
        work: pr.WorkUnit,
        progress: ProgressCallback | None,
        limits: TimeLimits,
        what: str,
    ) -> Any:
        """Run the body; result or Failure (TimeLimitExceeded when interrupted at hard)."""
        if not limits.any:
            return call_endpoint(endpoint, task, work, progress)
        guard = _Interruption(threading.get_ident(), what, limits)
        alarms = [
            _ALARMS.schedule(delay, functools.partial(guard.fire, kind))
            for kind, delay in (("soft", limits.soft), ("hard", limits.hard))
            if delay is not None
        ]
        try:
            try:
                result = call_endpoint(endpoint, task, work, progress)
            finally:
                guard.finish()
                for alarm_id in alarms:
                    _ALARMS.cancel(alarm_id)
        except (exc.SoftTimeLimitExceeded, exc.TimeLimitExceeded):
            # Fired outside the task's own code (its hooks, the endpoint).
            result = ft.Failure()
        if guard.fired == "hard" and not (
            isinstance(result, ft.Failure) and result.check(exc.TimeLimitExceeded)
        ):
            LOG.warning(
                "%s returned after its hard time limit; its outcome is reported as it is", what
            )
        return result

    def stop_cold(self) -> list[str]:
        """Cold shutdown: threads cannot be stopped; nothing to kill."""
        return []
