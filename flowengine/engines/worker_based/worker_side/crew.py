"""A worker's thread pool whose free threads take turns running its consume loops.

With a plain pool a request crosses two threads: the consume loop's thread
receives it and wakes a pool thread to run it. That wake-up (a futex, the
interpreter lock changing hands and, on a busy machine, a wait for a core)
sits between the request's acknowledgement and its body, on every request.
A crew runs the body on the thread that received it instead (the
leader/followers pattern): a consume loop is a series of rounds (one wait
for messages and the handling of what came), whichever crew thread is free
runs the next round, and a thread whose round took a request hands the loop
to another free thread and runs the request itself. The hand-over still
wakes a thread, but beside the body instead of before it.

It bounds what runs as a plain pool does: at most ``max_workers`` bodies at
once; a request taken while they all run waits in a queue for the first
thread that finishes. It keeps ``max_workers`` threads plus one per consume
loop, so a loop always has a thread to run it, even while every body slot
is taken (the loop then waits for room, keeping its connection alive, as
it does beside a plain pool).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Crew"]


class _Job:
    """A submitted call and the future it resolves."""

    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.future: cf.Future[Any] = cf.Future()
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # cancelled while it waited
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as e:
            self.future.set_exception(e)
        else:
            self.future.set_result(result)


class _Loop:
    """A consume loop's rounds, and how they ended."""

    __slots__ = ("ended", "error", "rounds")

    def __init__(self, rounds: Iterator[None]) -> None:
        self.rounds = rounds
        self.ended = threading.Event()
        self.error: BaseException | None = None

    def run_round(self) -> bool:
        """Run the next round on this thread; True when there is none left."""
        try:
            next(self.rounds)
        except StopIteration:
            return True
        except BaseException as e:
            self.error = e
            return True
        return False


class Crew(cf.Executor):
    """A thread pool (``concurrent.futures.Executor``) whose free threads also run consume loops.

    A worker that owns its pool makes one (``threads_count`` threads); pass
    one as a worker's ``executor`` to choose its size and thread names
    yourself. Any other executor works too, without the saved hand-over.
    :meth:`submit` called by the thread running a loop's round runs the call
    on that thread once the round is over; called elsewhere, on the first
    free thread. :meth:`shutdown` refuses new calls and (``wait``) returns
    once the calls already submitted have run.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str = "flowengine-crew") -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be > 0")
        # Named as ThreadPoolExecutor's, which is what pool sizes are read from.
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._cond = threading.Condition(threading.Lock())
        self._queued: collections.deque[_Job] = collections.deque()
        self._leaderless: collections.deque[_Loop] = collections.deque()
        self._loops = 0  # loops not ended
        self._running = 0  # calls running
        self._threads: list[threading.Thread] = []
        self._numbers = itertools.count(1)
        self._shutdown = False
        # .taken: on a thread running a round, what submit() was given meanwhile;
        # .running: whether this thread runs a call (shutdown() must not wait for it).
        self._local = threading.local()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Run ``fn(*args, **kwargs)`` on a crew thread; its future."""
        job = _Job(fn, args, kwargs)
        taken: list[_Job] | None = getattr(self._local, "taken", None)
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if taken is not None:
                taken.append(job)  # this thread runs it once its round is over
            else:
                self._queued.append(job)
                self._grow()
                self._cond.notify()
        return job.future

    def drive(self, rounds: Iterator[None]) -> None:
        """Run a consume loop's ``rounds`` on crew threads; return once they ended.

        Raises what a round raised (the rounds end there).
        """
        loop = _Loop(rounds)
        with self._cond:
            self._loops += 1
            self._grow()
            self._leaderless.append(loop)
            self._cond.notify()
        loop.ended.wait()
        if loop.error is not None:
            raise loop.error

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; ``wait``: return once the submitted ones have run.

        ``cancel_futures``: cancel those not started yet. Threads end once
        no loop is driven any more (joined here if none is). Called from a
        call the crew runs, it does not wait for that call.
        """
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._queued:
                    self._queued.popleft().future.cancel()
            self._cond.notify_all()
            if not wait:
                return
            mine = 1 if getattr(self._local, "running", False) else 0
            while self._queued or self._running > mine:
                self._cond.wait()
            threads = [] if self._loops else list(self._threads)
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join()

    # --- the threads ---

    def _grow(self) -> None:
        """Start threads up to one per call slot and one per loop (lock held)."""
        while len(self._threads) < self._max_workers + self._loops:
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"{self._prefix}-{next(self._numbers)}")
            thread.start()
            self._threads.append(thread)

    def _serve(self) -> None:
        """A crew thread: run a waiting call when a slot is free, else lead a loop."""
        while (work := self._next_work()) is not None:
            job = self._lead(work) if isinstance(work, _Loop) else work
            if job is not None:
                self._run(job)
            del job, work  # not kept (with a result) while this thread idles

    def _next_work(self) -> _Job | _Loop | None:
        """Wait for a call to run (counted as running) or a loop to lead; None: end."""
        with self._cond:
            while True:
                if self._queued and self._running < self._max_workers:
                    self._running += 1
                    return self._queued.popleft()
                if self._leaderless:
                    return self._leaderless.popleft()
                if self._shutdown and not self._queued and not self._loops:
                    self._threads.remove(threading.current_thread())
                    return None
                self._cond.wait()

    def _lead(self, loop: _Loop) -> _Job | None:
        """Run ``loop``'s rounds until one takes a call with a free slot; that call."""
        taken: list[_Job] = []
        self._local.taken = taken
        try:
            while True:
                ended = loop.run_round()
                if taken or ended:
                    job = self._hand_over(loop, taken, ended)
                    if job is not None or ended:
                        return job
        finally:
            self._local.taken = None

    def _hand_over(self, loop: _Loop, taken: list[_Job], ended: bool) -> _Job | None:
        """After a round that took calls or ended: the call this thread runs (None: none).

        Given one, the loop goes to the next free thread; the other calls
        wait for free threads (with no free slot, all wait, and this thread
        goes on running the loop).
        """
        job = None
        with self._cond:
            if taken and self._running < self._max_workers:
                job = taken.pop(0)
                self._running += 1
            wake = min(len(taken), self._max_workers - self._running)
            self._queued.extend(taken)
            taken.clear()
            if ended:
                self._loops -= 1
                self._cond.notify_all()  # idle threads may be free to end
            elif job is not None:
                self._leaderless.append(loop)
                wake += 1
            if wake:
                self._cond.notify(wake)
        if ended:
            loop.ended.set()
        return job

    def _run(self, job: _Job) -> None:
        self._local.running = True
        try:
            job.run()
        finally:
            self._local.running = False
            with self._cond:
                self._running -= 1
                if self._shutdown:
                    self._cond.notify_all()  # shutdown(wait) waits for this
