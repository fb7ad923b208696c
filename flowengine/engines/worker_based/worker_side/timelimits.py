"""Per-task time limits: where they come from, how they travel, how threads enforce them.

A task declares limits with two class (or instance) attributes, read next to
TaskFlow's ``version`` and ``default_provides``::

    class Resize(task.Task):
        soft_time_limit = 50   # seconds: SoftTimeLimitExceeded is raised inside execute()
        time_limit = 60        # seconds: the body is stopped, the request fails

The executor sends the limits of the task *instance* in the ``timelimit``
header (``[soft, hard]``, either may be null), so a per-instance value
overrides the class. A worker takes, field by field, the header, else the
class attributes of its own task class, else its own defaults
(``--soft-time-limit`` / ``--time-limit``).

Enforcement depends on the worker's executor. With processes (a forked child
per task, see :mod:`process_runner`) the hard limit kills the child. With
threads (:class:`ThreadRunner`, the default) nothing can kill a thread: both
limits raise an exception inside the task's thread at its next Python
instruction, so a body blocked in one long C call (a socket read without a
timeout) only notices when that call returns; the request keeps running and
heartbeating meanwhile, and is never reported finished while its body runs.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

#: Task attribute holding the soft limit (seconds): an exception inside the body.
SOFT_ATTR = "soft_time_limit"
#: Task attribute holding the hard limit (seconds): the body is stopped.
HARD_ATTR = "time_limit"


class TimeLimits(NamedTuple):
    """Soft and hard limits in seconds for one task body (None: no limit)."""

    soft: float | None = None
    hard: float | None = None

    @property
    def any(self) -> bool:
        """Whether at least one limit is set."""
        return self.soft is not None or self.hard is not None

    def __str__(self) -> str:
        def fmt(v: float | None) -> str:
            return "none" if v is None else f"{v:g} s"
        return f"soft {fmt(self.soft)}, hard {fmt(self.hard)}"


NO_LIMITS = TimeLimits()


def _checked(value: Any, what: str) -> float | None:
    """A limit value: None or a positive number of seconds; InvalidFormat otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise exc.InvalidFormat(f"{what} must be a positive number of seconds or null,"
                                f" not {value!r}")
    return float(value)


def make(soft: Any = None, hard: Any = None) -> TimeLimits:
    """TimeLimits from two values (checked: positive seconds or None)."""
    return TimeLimits(_checked(soft, "soft time limit"), _checked(hard, "hard time limit"))


def from_task(task: Any) -> TimeLimits:
    """The limits a task (instance or class) declares through its attributes."""
    return make(getattr(task, SOFT_ATTR, None), getattr(task, HARD_ATTR, None))


def to_header(limits: TimeLimits) -> list[float | None] | None:
    """The ``timelimit`` header value for ``limits`` (None when there are none)."""
    return [limits.soft, limits.hard] if limits.any else None


def parse_header(value: Any) -> TimeLimits:
    """Read a ``timelimit`` header (``[soft, hard]`` or null); InvalidFormat if unreadable."""
    if value is None:
        return NO_LIMITS
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise exc.InvalidFormat(f"Header '{pr.HEADER_TIMELIMIT}' must be [soft, hard],"
                                f" not {value!r}")
    return make(value[0], value[1])


def resolve(header: Any, task_cls: Any, default: TimeLimits = NO_LIMITS) -> TimeLimits:
    """The limits a worker applies: header, else task class attributes, else ``default``.

    Raises InvalidFormat when the header cannot be read (the request is refused).
    """
    sent = parse_header(header)
    try:
        declared = from_task(task_cls)
    except exc.InvalidFormat:
        LOG.warning("Task class %s declares invalid time limits; ignoring them", task_cls)
        declared = NO_LIMITS
    soft = next((v for v in (sent.soft, declared.soft, default.soft) if v is not None), None)
    hard = next((v for v in (sent.hard, declared.hard, default.hard) if v is not None), None)
    return TimeLimits(soft, hard)


def header_for(task: Any) -> list[float | None] | None:
    """Executor side: the ``timelimit`` header for ``task`` (None when it sets no limits)."""
    try:
        return to_header(from_task(task))
    except exc.InvalidFormat as e:
        LOG.warning("Task %r has invalid time limits (%s); sending none", task, e)
        return None


# --- running a body with limits (threads) ---------------------------------------


class _Alarms:
    """One daemon thread firing callbacks at deadlines (no thread per request)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, delay_s: float, callback: Callable[[], None]) -> int:
        """Call ``callback`` (on the alarm thread) in ``delay_s`` seconds; return an id."""
        with self._cond:
            alarm_id = next(self._ids)
            heapq.heappush(self._heap, (time.monotonic() + delay_s, alarm_id, callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="flowengine-timelimits")
                self._thread.start()
            self._cond.notify()
        return alarm_id

    def cancel(self, alarm_id: int) -> None:
        """Forget an alarm (no effect once it fired)."""
        with self._cond:
            if any(entry[1] == alarm_id for entry in self._heap):
                self._cancelled.add(alarm_id)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cond.wait(timeout)
                _, alarm_id, callback = heapq.heappop(self._heap)
                if alarm_id in self._cancelled:
                    self._cancelled.discard(alarm_id)
                    continue
            try:
                callback()
            except Exception:
                LOG.exception("Time limit alarm failed")


_ALARMS = _Alarms()


def _raise_in_thread(thread_id: int, error_cls: type[BaseException]) -> bool:
    """Ask CPython to raise ``error_cls`` in thread ``thread_id`` at its next instruction."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(error_cls))
    return done == 1


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
                LOG.warning("%s exceeded its soft time limit of %g s: raising"
                            " SoftTimeLimitExceeded in it", self.what, self.limits.soft)
                _raise_in_thread(self.thread_id, exc.SoftTimeLimitExceeded)
            else:
                LOG.warning("%s exceeded its hard time limit of %g s: a thread cannot be"
                            " killed, so TimeLimitExceeded is raised in it at its next Python"
                            " instruction (use the process executor to kill it)", self.what,
                            self.limits.hard)
                _raise_in_thread(self.thread_id, exc.TimeLimitExceeded)

    def finish(self) -> None:
        with self.lock:
            self.done = True
            if self.fired is not None:
                _clear_in_thread(self.thread_id)


#: (endpoint, task, work, progress_callback, limits, what) -> result or Failure.
BodyRunner = Callable[[Any, Any, pr.WorkUnit, Any, TimeLimits, str], Any]


def call_endpoint(endpoint: Any, task: Any, work: pr.WorkUnit, progress: Any) -> Any:
    """Run the request's action through its endpoint in this thread (result or Failure)."""
    method = endpoint.execute if work.action == pr.EXECUTE else endpoint.revert
    return method(task, progress_callback=progress, **work.arguments)


class ThreadRunner:
    """Runs a task body in the calling (pool) thread, enforcing limits by interruption."""

    kind = "threads"

    def run(self, endpoint: Any, task: Any, work: pr.WorkUnit, progress: Any,
            limits: TimeLimits, what: str) -> Any:
        """Run the body; result or Failure (TimeLimitExceeded when interrupted at hard)."""
        if not limits.any:
            return call_endpoint(endpoint, task, work, progress)
        guard = _Interruption(threading.get_ident(), what, limits)
        alarms = [_ALARMS.schedule(delay, lambda k=kind: guard.fire(k))
                  for kind, delay in (("soft", limits.soft), ("hard", limits.hard))
                  if delay is not None]
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
        if guard.fired == "hard" and not (isinstance(result, ft.Failure)
                                          and result.check(exc.TimeLimitExceeded)):
            LOG.warning("%s returned after its hard time limit; its outcome is reported"
                        " as it is", what)
        return result

    def stop_cold(self) -> list[str]:
        """Cold shutdown: threads cannot be stopped; nothing to kill."""
        return []
