"""What a worker's Server calls to run one request's body: limits, executor kind, gate.

The Server owns the protocol (RUNNING, heartbeats, replies); this owns how
the body runs: in the pool thread (:class:`~timelimits.ThreadRunner`) or in
a forked child (:class:`~process_runner.ProcessRunner`), under the time
limits the request, its task class or the worker set, and behind the
shutdown gate that stops any outcome from leaving once a cold shutdown gave
the request back.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import timelimits as tl
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.worker_side import timelimits as thread_limits
from flowengine.engines.worker_based.worker_side.endpoint import Endpoint, ProgressCallback
from flowengine.task import BaseTask
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

#: Names of the body executors a worker can use (``Worker(executor=...)``,
#: ``flowengine worker --executor``).
THREADS = "threads"
PROCESSES = "processes"
EXECUTOR_KINDS = (THREADS, PROCESSES)
_ALIASES = {"thread": THREADS, "threads": THREADS, "process": PROCESSES, "processes": PROCESSES}


def executor_kind(name: str) -> str:
    """Canonical executor kind for ``name`` ('thread(s)' or 'process(es)'); ValueError else."""
    try:
        return _ALIASES[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"Unknown worker executor {name!r}; expected one of {list(EXECUTOR_KINDS)}"
        ) from None


class BodyRunner(Protocol):
    """Runs one request's body under its time limits (in this thread, or in a child)."""

    #: THREADS or PROCESSES.
    kind: str

    def run(
        self,
        endpoint: Endpoint,
        task: BaseTask,
        work: pr.WorkUnit,
        progress: ProgressCallback | None,
        limits: tl.TimeLimits,
        what: str,
    ) -> Any:
        """Run the body; its result or a Failure (never raises for the task's errors)."""

    def stop_cold(self) -> list[str]:
        """Cold shutdown: refuse new bodies, kill what can be killed; what was killed."""


def make_body_runner(kind: str) -> BodyRunner:
    """A body runner of the given kind."""
    if executor_kind(kind) == PROCESSES:
        from flowengine.engines.worker_based.worker_side import forked as process_runner

        return process_runner.ProcessRunner()
    return thread_limits.ThreadRunner()


class Gate:
    """Lets outcomes out until a cold shutdown closes it; then holds threads back.

    A thread asks before starting a body (:meth:`admit`) and before its
    outcome is sent (:meth:`commit`). After :meth:`close`, both answer False
    and the caller parks for good (the process is about to exit): a request
    the shutdown gave back is never also answered, nor started late.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        # Pool thread -> the request whose outcome it is sending (at most one
        # each, so this never grows beyond the pool size).
        self._committed: dict[int, tuple[str, str]] = {}
        self._never = threading.Event()

    @property
    def closed(self) -> bool:
        """Whether a cold shutdown closed the gate."""
        return self._closed

    def admit(self) -> bool:
        """May a body start now?"""
        with self._lock:
            self._committed.pop(threading.get_ident(), None)
            return not self._closed

    def commit(self, key: tuple[str, str]) -> bool:
        """May the outcome of ``key`` be sent? (Yes until closed.)"""
        with self._lock:
            if self._closed:
                return False
            self._committed[threading.get_ident()] = key
            return True

    def close(self) -> set[tuple[str, str]]:
        """Close the gate; return the requests whose outcome is already on its way."""
        with self._lock:
            self._closed = True
            return set(self._committed.values())

    def park(self) -> None:
        """Block the calling thread until the process exits."""
        self._never.wait()


class TaskRunner:
    """Runs request bodies for a Server: resolves limits, picks the runner, guards outcomes."""

    def __init__(
        self, executor: str = THREADS, default_limits: tl.TimeLimits = tl.NO_LIMITS
    ) -> None:
        self.kind = executor_kind(executor)
        self.default_limits = default_limits
        self.body_runner: BodyRunner = make_body_runner(self.kind)
        self.gate = Gate()
        self._stoppers: dict[tuple[str, str], thread_limits.Stopper] = {}
        self._stoppers_lock = threading.Lock()

    def run(
        self,
        endpoint: Endpoint,
        task: BaseTask,
        work: pr.WorkUnit,
        progress: ProgressCallback | None,
        headers: Headers,
        key: tuple[str, str],
    ) -> Any:
        """Run one request's body; its result or a Failure (parks after a cold shutdown)."""
        what = f"Request {key[0]} ({work.action} of task {work.task_name!r})"
        try:
            limits = tl.resolve(headers.timelimit, endpoint.task_cls, self.default_limits)
        except exc.InvalidFormat as e:
            return ft.Failure.from_exception(e)
        if not self.gate.admit():
            self.gate.park()
        stopper = thread_limits.Stopper(threading.get_ident(), what)
        with self._stoppers_lock:
            self._stoppers[key] = stopper
        try:
            result = self.body_runner.run(endpoint, task, work, progress, limits, what)
        except exc.RequestFenced as e:  # stopped outside the task's own code
            result = ft.Failure.from_exception(e)
        finally:
            with self._stoppers_lock:
                self._stoppers.pop(key, None)
            stopper.finish()
        if not self.gate.commit(key):
            self.gate.park()
        return result

    def interrupt(self, key: tuple[str, str]) -> bool:
        """Stop the body of ``key`` now: kill its child, or raise RequestFenced in its thread.

        A thread notices at its next Python instruction (not inside one long
        C call). False when no body of ``key`` runs.
        """
        with self._stoppers_lock:
            stopper = self._stoppers.get(key)
        if stopper is None:
            return False
        if self.kind == PROCESSES:
            kill = getattr(self.body_runner, "kill", None)
            return bool(kill is not None and kill(stopper.what))
        return stopper.stop()

    def stop_cold(self) -> tuple[set[tuple[str, str]], list[str]]:
        """Close the gate and kill what can be killed: (outcomes on their way, killed)."""
        sending = self.gate.close()
        return sending, self.body_runner.stop_cold()
