"""The process executor: each task body runs in a child forked for it (as RQ does).

The worker keeps its threads (one per concurrent request); each of them forks
a child, which runs the body and reports back through a pipe as JSON lines —
progress events as they happen, then the outcome — and exits. The thread
forwards events to the executor and waits for the outcome until the hard
limit, when it kills the child (SIGKILL) and reports TimeLimitExceeded; the
worker itself is never at risk. The soft limit is a SIGALRM in the child that
raises SoftTimeLimitExceeded inside the body, wherever it is (even in
``time.sleep``).

The child is a fork of a multi-threaded process: only the forking thread
exists in it. Task code must not rely on threads, locks or connections of the
worker; what it opens itself is its own. The child ignores SIGINT and SIGTERM
(a Ctrl+C or a service manager's SIGTERM to the whole group must not kill a
body a warm shutdown is waiting for); the worker decides when to kill it.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import threading
import time
import types
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import timelimits as tl
from flowengine.engines.worker_based.worker_side import timelimits as thread_limits
from flowengine.engines.worker_based.worker_side.endpoint import Endpoint, ProgressCallback
from flowengine.task import BaseTask
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

#: Bytes read from a child's pipe at a time.
READ_CHUNK_BYTES = 65536

#: Exit status of a child that could not report its outcome (pipe broken).
_CHILD_FAILED = 70


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _send(fd: int, message: dict[str, Any]) -> None:
    """One JSON line to the parent (JSON only: nothing is ever pickled)."""
    _write_all(fd, json.dumps(message, allow_nan=False).encode("utf-8") + b"\n")


def _outcome_message(result: Any) -> dict[str, Any]:
    """The outcome line for ``result`` (a value, or a Failure)."""
    if isinstance(result, ft.Failure):
        return {"failure": pr.failure_to_dict(result)}
    message = {"result": result}
    try:
        json.dumps(message, allow_nan=False)
    except (TypeError, ValueError, OverflowError) as e:
        failure = ft.Failure.from_exception(
            exc.SerializationFailure(f"The result of the task cannot be sent as JSON: {e}")
        )
        return {"failure": pr.failure_to_dict(failure)}
    return message


def _on_alarm(signum: int, frame: types.FrameType | None) -> None:
    raise exc.SoftTimeLimitExceeded()


def _child_main(
    fd: int, endpoint: Endpoint, task: BaseTask, work: pr.WorkUnit, limits: tl.TimeLimits
) -> None:
    """Body of the forked child: run the task, report over ``fd``, never return."""
    status = 0
    try:
        # The worker's signal wakeup socket is not ours to write to.
        signal.set_wakeup_fd(-1)
        # The worker decides when a child dies; see the module docstring.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if limits.soft is not None:
            signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, limits.soft)

        def progress(event_type: str, details: dict[str, Any]) -> None:
            _send(fd, {"event": event_type, "details": dict(details or {})})

        try:
            result = thread_limits.call_endpoint(endpoint, task, work, progress)
        except exc.SoftTimeLimitExceeded:
            # Fired outside the task's own code (its hooks, the endpoint).
            result = ft.Failure()
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        except exc.SoftTimeLimitExceeded:
            pass  # it fired just as the body returned: the outcome stands
        _send(fd, _outcome_message(result))
    except BaseException:
        status = _CHILD_FAILED
    finally:
        os._exit(status)


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)}"


class ProcessRunner:
    """Runs each task body in a forked child; a hard limit kills the child."""

    kind = "processes"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[int, str] = {}
        # Pool thread -> the child it runs now; children killed by a cancellation.
        self._by_thread: dict[int, int] = {}
        self._cancelled: set[int] = set()
        self._cold = False

    @property
    def children(self) -> list[int]:
        """Pids of the children running right now."""
        with self._lock:
            return list(self._children)

    def run(
        self,
        endpoint: Endpoint,
        task: BaseTask,
        work: pr.WorkUnit,
        progress: ProgressCallback | None,
        limits: tl.TimeLimits,
        what: str,
    ) -> Any:
        """Fork, run the body in the child, relay its events; result or Failure."""
        read_fd, write_fd = os.pipe()
        with self._lock:
            refused = self._cold  # a local: self._cold changes under other threads
            if refused:
                os.close(read_fd)
                os.close(write_fd)
                return ft.Failure.from_exception(
                    exc.WorkerShutdown(f"{what} was not started: the worker is stopping")
                )
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child, which never returns
                os.close(read_fd)
                _child_main(write_fd, endpoint, task, work, limits)
            self._children[pid] = what
            self._by_thread[threading.get_ident()] = pid
        os.close(write_fd)
        try:
            outcome, timed_out = self._relay(read_fd, pid, progress, limits, what)
        finally:
            os.close(read_fd)
            status = self._reap(pid)
            with self._lock:
                self._children.pop(pid, None)
                self._by_thread.pop(threading.get_ident(), None)
                cancelled = pid in self._cancelled
                self._cancelled.discard(pid)
                cold = self._cold
        if cancelled and outcome is None:
            LOG.warning("%s was cancelled: its process %d was killed", what, pid)
            return ft.Failure.from_exception(
                exc.RequestCancelled(f"{what} was cancelled while it ran; its process was killed")
            )
        if timed_out:
            LOG.warning(
                "%s exceeded its hard time limit of %g s: its process %d was killed",
                what,
                limits.hard,
                pid,
            )
            return ft.Failure.from_exception(
                exc.TimeLimitExceeded(
                    f"{what} exceeded its hard time limit of {limits.hard:g} s; its process"
                    f" was killed"
                )
            )
        if outcome is None:
            if cold:
                return ft.Failure.from_exception(
                    exc.WorkerShutdown(f"{what} was stopped: the worker is shutting down")
                )
            LOG.error(
                "%s: its process %d %s without reporting an outcome",
                what,
                pid,
                _describe_status(status),
            )
            return ft.Failure.from_exception(
                exc.TaskProcessDied(
                    f"{what}: its process {_describe_status(status)} without reporting an outcome"
                )
            )
        if "failure" in outcome:
            return ft.Failure.from_dict(outcome["failure"])
        return outcome.get("result")

    def _relay(
        self, fd: int, pid: int, progress: ProgressCallback | None, limits: tl.TimeLimits, what: str
    ) -> tuple[dict[str, Any] | None, bool]:
        """Read the child's lines until EOF or the hard limit: (outcome or None, timed out)."""
        deadline = None if limits.hard is None else time.monotonic() + limits.hard
        buffer = b""
        outcome: dict[str, Any] | None = None
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                self._kill(pid)
                return None, True
            chunk = os.read(fd, READ_CHUNK_BYTES)
            if not chunk:
                return outcome, False
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:
                    LOG.warning("%s: unreadable line from its process ignored", what)
                    continue
                if "event" in message:
                    if progress is not None:
                        progress(message["event"], message.get("details") or {})
                else:
                    outcome = message

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _reap(self, pid: int) -> int:
        """Wait for the child to end and return its status.

        Called after its pipe closed (it exits right after writing its
        outcome) or after it was killed, so this wait is short.
        """
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                return status
            except ChildProcessError:
                return 0
            except InterruptedError:  # pragma: no cover - Python retries EINTR itself
                continue

    def kill(self, what: str) -> bool:
        """Kill the child running the body described by ``what``; False if none does."""
        with self._lock:
            victims = [pid for pid, running in self._children.items() if running == what]
        for pid in victims:
            self._kill(pid)
        return bool(victims)

    def cancel_thread(self, thread_id: int) -> bool:
        """Kill the child run by pool thread ``thread_id`` (a cancellation); True if one was."""
        with self._lock:
            pid = self._by_thread.get(thread_id)
            if pid is None:
                return False
            self._cancelled.add(pid)
        self._kill(pid)
        return True

    def stop_cold(self) -> list[str]:
        """Cold shutdown: refuse new bodies, SIGKILL running children; what they ran."""
        with self._lock:
            self._cold = True
            victims = dict(self._children)
        for pid in victims:
            self._kill(pid)
        return list(victims.values())
