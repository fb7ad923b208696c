"""A worker cut off from its broker stops its requests before its engine runs them again.

An engine takes a held request for lost once its worker has been silent for
the loss bound (the worker's heartbeat interval times the engine's
``heartbeat_misses``, or its ``lost_after``; requests carry both), and
dispatches it again. A worker whose link to the broker is black-holed (a
network partition: no error, just silence) would otherwise go on running
the request while another worker runs it too.

So each held request remembers when the latest reply about it that is known
to have reached the broker was sent (``Held.confirmed_at``: taking it, then
each heartbeat round the broker confirmed, see ``Replier.send_heartbeats``).
The engine cannot have heard of the request later than that, so it will not
dispatch it again before ``confirmed_at + bound``. A thread of its own (not
the heartbeat thread, which a partition blocks in a publish) checks every
held request, and once ``FENCE_AT_FRACTION`` of the bound has passed
without a confirmed heartbeat it stops it: a request waiting for a thread
never starts; a running body is interrupted (its child killed with the
process executor; with threads, RequestFenced is raised in it at its next
Python instruction). Its outcome is a FAILURE ``RequestFenced``, which an
engine still waiting for that attempt takes as a give-back (it dispatches
it again at once) and one that moved on ignores as a superseded attempt.

A broker that is down (it refuses or resets connections: publishing fails
with errors) is not a partition: every engine is cut off too and forgives
the silence once it is back, so nothing is stopped then, and each held
request's clock restarts when publishing works again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.worker_side import held as held_mod
from flowengine.engines.worker_based.worker_side.runner import TaskRunner

LOG = logging.getLogger(__name__)

__all__ = ["FENCE_AT_FRACTION", "Fence"]

#: Share of the engine's loss bound after which an unconfirmed request is
#: stopped: the rest (a fifth: 0.2 s of the tests' 1 s, 1.2 s of the default
#: 6 s) is left for the check's own period, for a thread body to reach its
#: next instruction and for the kill, before the engine can dispatch again.
FENCE_AT_FRACTION = 0.8

#: Checks per heartbeat interval: often enough that the fence is never more
#: than half an interval late.
CHECKS_PER_INTERVAL = 2


class Fence:
    """Stops held requests whose heartbeats stopped reaching the broker (see module doc).

    ``memory`` holds the requests, ``runner`` runs their bodies;
    ``interval_s`` is this worker's heartbeat interval; ``worker_id`` names
    it in logs.
    """

    def __init__(
        self,
        memory: held_mod.RequestMemory,
        runner: TaskRunner,
        interval_s: float,
        worker_id: str,
        broker_failing: Callable[[], bool] = lambda: False,
        *,
        thread_name: str = "flowengine-fence",
    ) -> None:
        self._broker_failing = broker_failing
        self._forgive = False
        self._memory = memory
        self._runner = runner
        self._interval = interval_s
        self._worker_id = worker_id
        self._stopping = threading.Event()
        self._thread_name = thread_name
        self._thread: threading.Thread | None = None
        # Fenced requests whose body was interrupted already.
        self._interrupted: set[held_mod.Key] = set()

    def bound_s(self, held: held_mod.Held) -> float:
        """The engine's loss bound for ``held`` (s)."""
        misses, lost_after = held.loss_bound
        if lost_after is not None:
            return lost_after
        return lv.lost_after(self._interval, misses or lv.HEARTBEAT_MISSES)

    def check(self, now: float) -> list[held_mod.Held]:
        """Stop every request unconfirmed for too long at ``now`` (monotonic); those stopped."""
        stopped: list[held_mod.Held] = []
        held_now = self._memory.held()
        if self._broker_failing():
            # The broker is down for everyone (it answers with errors, where a
            # partition is silent): engines cannot hear anyone either and
            # forgive the silence once back (see the executor's housekeeper),
            # so held requests are not stopped; their clocks restart then.
            self._forgive = True
            return stopped
        if self._forgive:
            self._forgive = False
            for held in held_now:
                held.confirmed_at = max(held.confirmed_at, now)
        self._interrupted &= {held.key for held in held_now}
        for held in held_now:
            if not held.announced:
                continue  # a TaskFlow engine: it never takes a held request for lost
            if not held.fenced:
                bound = self.bound_s(held)
                silent = now - held.confirmed_at
                if silent <= bound * FENCE_AT_FRACTION or self._memory.fence(held) is None:
                    continue
                stopped.append(held)
                LOG.warning(
                    "Worker %s could not confirm a heartbeat of request %s (%s) to"
                    " its broker for %.1f s (its engine takes it for lost after"
                    " %.1f s): stopping it here; its engine dispatches it again"
                    " elsewhere",
                    self._worker_id,
                    held.key[0],
                    held.key[1],
                    silent,
                    bound,
                )
            # Until its body is stopped: it may start a moment after it was
            # fenced (its thread was sending RUNNING), so look again each round.
            if (
                held.state == held_mod.RUNNING
                and held.key not in self._interrupted
                and self._runner.interrupt(held.key[:2])
            ):
                self._interrupted.add(held.key)
        return stopped

    def start(self) -> None:
        """Start the checking thread (again, after stop())."""
        self._stopping.clear()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=self._thread_name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Let the checking thread end once nothing is held (held requests stay guarded)."""
        self._stopping.set()

    def join(self, timeout_s: float) -> bool:
        """Wait until the checking thread ended, ``timeout_s`` at most; True if it did."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _loop(self) -> None:
        period_s = self._interval / CHECKS_PER_INTERVAL
        never = threading.Event()
        while not (self._stopping.is_set() and len(self._memory) == 0):
            if self._stopping.is_set():
                # Stopped, guarding what is still held: the last request
                # answered ends the wait (and the thread).
                if self._memory.wait_until_at_most(0, never, period_s):
                    continue
            elif self._stopping.wait(period_s):
                continue  # stop() ends the wait: with nothing held, the thread too
            try:
                self.check(time.monotonic())
            except Exception:
                LOG.exception("Fence check of worker %s failed; retrying", self._worker_id)
