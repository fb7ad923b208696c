"""Warm and cold shutdown of a worker (SIGTERM/SIGINT once, then again).

Warm (first signal): the worker tells executors it is leaving and stops
consuming, so no new request reaches it; requests it already took run to the
end while it keeps sending their heartbeats, and their outcomes are sent;
then it exits 0.

Cold (a second signal, at any time): the worker stops at once. Bodies
running in forked children (process executor) are killed first; then every
request it took and has not answered is answered with a FAILURE carrying
``WorkerShutdown``, which executors treat as "dispatch it again elsewhere"
(not a task failure), and the process exits with status 1. A body running in
a thread cannot be stopped: it ends with the process, a few milliseconds
after the give-back replies are published (the next attempt needs at least
two broker hops before it can start elsewhere).

Where a shutdown is (SERVING, WARM, COLD, STOPPED) is an automaton machine,
built once and frozen (:func:`build_shutdown_machine`); a move it does not
allow raises InvalidState.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from automaton import machines

from flowengine import exceptions as exc
from flowengine.engines.worker_based.wire.machine import make_an_event
from flowengine.engines.worker_based.worker_side.waker import Waker
from flowengine.engines.worker_based.worker_side.worker import Worker

LOG = logging.getLogger(__name__)

#: Seconds between two "still waiting" log lines of a warm shutdown: often
#: enough to show it is alive, rarely enough to stay readable (the server's
#: heartbeat thread goes on beating for each held request meanwhile).
WARM_PROGRESS_PERIOD_S = 2.0

#: Seconds a cold shutdown waits for outcomes that were already being sent
#: when it began (publishing one takes milliseconds; this bounds a dead broker).
COLD_FLUSH_TIMEOUT_S = 5.0

#: Seconds a warm shutdown waits for the consume loop to end after asking it
#: to (it checks every ON_WAIT_PERIOD_S; a message being dispatched must be
#: handed to the pool before the pool stops accepting work).
CONSUMER_STOP_TIMEOUT_S = 10.0

#: Seconds during which a repeat of the *same* signal is taken as one more
#: copy of the first, not as a request for a cold shutdown: timeout(1) and
#: some supervisors signal both the process and its process group.
DUPLICATE_SIGNAL_WINDOW_S = 0.5

#: Exit statuses of the ``flowengine worker`` command.
EXIT_WARM = 0
EXIT_COLD = 1
EXIT_ERROR = 1

# Where a shutdown is.
SERVING = "serving"
WARM = "warm"
COLD = "cold"
STOPPED = "stopped"


def build_shutdown_machine(freeze: bool = True) -> machines.FiniteMachine:
    """Build the state machine of a worker's shutdown."""
    m = machines.FiniteMachine()
    for state in (SERVING, WARM, COLD):
        m.add_state(state)
    m.add_state(STOPPED, terminal=True)
    m.default_start_state = SERVING
    # The first signal (or the worker failed): stop taking requests.
    m.add_transition(SERVING, WARM, make_an_event(WARM))
    # Every request taken was answered.
    m.add_transition(WARM, STOPPED, make_an_event(STOPPED))
    # A second signal: give back what is not answered.
    m.add_transition(WARM, COLD, make_an_event(COLD))
    # Given back; the process exits.
    m.add_transition(COLD, STOPPED, make_an_event(STOPPED))
    if freeze:
        m.freeze()
    return m


# Built once: a shutdown moves through the (state, event) -> state table read
# off the frozen machine.
MACHINE = build_shutdown_machine()
TRANSITIONS: dict[tuple[str, str], str] = {(s, e): t for s, e, t in MACHINE}


def _name(signum: int | None) -> str:
    if signum is None:
        return "stop request"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Shutdown:
    """Runs a worker until a signal, then shuts it down warm (then cold on a second one).

    ``run_kwargs`` go to ``worker.run()`` (default: no banner). Raises
    InvalidState when asked to move in a way its machine does not allow
    (warm twice, cold before warm).
    """

    def __init__(self, worker: Worker, **run_kwargs: Any) -> None:
        self._worker = worker
        self._run_kwargs = run_kwargs or {"display_banner": False}
        # Re-entrant: the signal handler takes it on the main thread.
        self._lock = threading.RLock()
        self._waker = Waker()
        self._requests = 0
        self._first: tuple[int | None, float] | None = None
        self._drained = False
        self._failed = False
        self._state = SERVING  # the machine's start state
        self._runner: threading.Thread | None = None

    @property
    def state(self) -> str:
        """Where the shutdown is: SERVING, WARM, COLD or STOPPED."""
        return self._state

    def _move(self, new_state: str) -> None:
        target = TRANSITIONS.get((self._state, make_an_event(new_state)))
        if target is None:
            raise exc.InvalidState(f"Worker shutdown cannot move from {self._state} to {new_state}")
        LOG.debug("Worker shutdown: %s -> %s", self._state, target)
        self._state = target

    @property
    def requests(self) -> int:
        """How many shutdown requests were counted (1: warm, 2 or more: cold)."""
        return self._requests

    # --- requests (signal handlers, other threads) ---

    def install_signal_handlers(self) -> None:
        """SIGINT and SIGTERM request a shutdown (warm first, cold the second time)."""
        self._waker.install()
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
        self.request(signum)

    def request(self, signum: int | None = None) -> None:
        """Ask for a shutdown: warm the first time, cold after that."""
        now = time.monotonic()
        with self._lock:
            if (
                self._first is not None
                and signum is not None
                and self._requests == 1
                and self._first[0] == signum
                and now - self._first[1] < DUPLICATE_SIGNAL_WINDOW_S
            ):
                return  # the same signal delivered twice at once
            if self._first is None:
                self._first = (signum, now)
            self._requests += 1
            count = self._requests
        self._waker.wake()
        if count == 1:
            LOG.info("%s: warm shutdown requested", _name(signum))
        elif count == 2:
            LOG.warning("%s again: cold shutdown requested", _name(signum))

    # --- the main thread ---

    def serve(self) -> int:
        """Run the worker until asked to stop; return the exit status (warm 0, cold 1)."""
        # `flowengine control shutdown <worker>` asks as a first signal would.
        self._worker.on_shutdown_request = self.request
        runner = threading.Thread(target=self._serve, name="flowengine-worker", daemon=True)
        self._runner = runner
        runner.start()
        self._wait_main(lambda: self._requests >= 1 or self._failed)
        failed = self._failed
        if failed:
            self.request()
        status = self.warm()
        return EXIT_ERROR if failed and status == EXIT_WARM else status

    def _serve(self) -> None:
        try:
            self._worker.run(**self._run_kwargs)
        except Exception:
            LOG.exception("Worker stopped on an error")
            with self._lock:
                self._failed = True
            self._waker.wake()

    def warm(self) -> int:
        """Stop taking requests, finish and answer running ones (heartbeating), exit status."""
        self._move(WARM)
        worker = self._worker
        taken = worker.running_requests()
        started = sum(1 for _, _, s in taken if s)
        if taken:
            # Worth a warning only when there is work a second signal would cut short.
            LOG.warning(
                "Warm shutdown: no new requests; finishing %d running request(s)"
                " (%d more taken, not started); send the signal again to stop now"
                " (cold shutdown: they are given back to be run elsewhere)",
                started,
                len(taken) - started,
            )
        else:
            LOG.info("Warm shutdown: no new requests, none running")
        worker.stop_serving()  # announces 'leaving' and stops consuming
        if self._runner is not None:
            # A request being dispatched right now still reaches the pool.
            self._runner.join(CONSUMER_STOP_TIMEOUT_S)
            if self._runner.is_alive():
                LOG.warning(
                    "Warm shutdown: the consume loop did not end within %.0f s",
                    CONSUMER_STOP_TIMEOUT_S,
                )
        drain = threading.Thread(target=self._drain, name="flowengine-drain", daemon=True)
        drain.start()
        while True:
            self._wait_main(lambda: self._drained or self._requests >= 2, WARM_PROGRESS_PERIOD_S)
            if self._requests >= 2:
                break
            if self._drained:
                LOG.info("Warm shutdown complete: every request taken was answered")
                self._move(STOPPED)
                return EXIT_WARM
            # The server's heartbeat thread keeps beating for what it holds.
            LOG.info(
                "Warm shutdown: still waiting for %d request(s)", len(worker.running_requests())
            )
        return self.cold()

    def _drain(self) -> None:
        self._worker.shutdown_pool(wait=True)
        with self._lock:
            self._drained = True
        self._waker.wake()

    def _wait_main(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait on the main thread until ``predicate()`` holds (or ``timeout`` passes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if predicate():
                    return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._waker.wait(remaining)

    def cold(self) -> int:
        """Kill children, give unanswered requests back, return the exit status (1)."""
        self._move(COLD)
        worker = self._worker
        sending, killed = self._worker.task_runner.stop_cold()
        self._worker.shutdown_pool(wait=False, cancel_futures=True)
        given_back = 0
        for key, _reply_to, started in worker.running_requests():
            if key in sending:
                continue  # its outcome is being published right now
            what = "running" if started else "taken but not started"
            error = exc.WorkerShutdown(
                f"Worker {worker.worker_id} stopped (cold shutdown) with request {key[0]}"
                f" ({key[1]}) {what}; it was given back to be run elsewhere"
            )
            # The reply carries the request's attempt: an executor that has
            # moved on to a later attempt ignores it (fencing).
            if worker.give_back(key, error):
                given_back += 1
            else:
                LOG.error(
                    "Cold shutdown: could not give request %s back; its executor will"
                    " notice the missing heartbeats",
                    key[0],
                )
        self._flush(worker, sending)
        LOG.warning(
            "Cold shutdown: gave back %d request(s) (%d task process(es) killed); exiting now",
            given_back,
            len(killed),
        )
        self._move(STOPPED)
        return EXIT_COLD

    def _flush(self, worker: Worker, sending: set[tuple[str, str]]) -> None:
        """Wait (bounded) until outcomes already on their way have been published."""
        if not sending:
            return
        left = worker.wait_until_sent(sending, COLD_FLUSH_TIMEOUT_S)
        if left:
            LOG.warning(
                "Cold shutdown: %d outcome(s) were still being sent after %.1f s",
                len(left),
                COLD_FLUSH_TIMEOUT_S,
            )
