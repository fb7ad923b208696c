"""Which requests a worker may run on the consume loop's own thread: short ones, taken alone.

Handing a taken request to a pool thread costs a thread wake-up (and, under
the interpreter lock, often a second wait for it) on every task's path: about
7 % of a steady task on the memory transport. A worker whose pool is its own
therefore runs a request on the thread that took it when the loop has nothing
else to do meanwhile: no other request waits for its outcome (one whose
outcome is on its way counts as done, though its pool thread lets go of it
just after: a chain's next request may arrive first), its engine sent it only once
this loop was done with the one before (a chain's next task, not one of a
burst queued behind it: :class:`Pace`), and the bodies of that task class and
action ran short (under :data:`SHORT_BODY_S`) the last :data:`SHORT_STREAK`
times. The loop then takes nothing for that short while,
as if the request had filled the worker for a moment; heartbeats, control
requests and time limits have threads of their own. A body that runs long
anyway (its class's history misled) holds the loop only once: its class goes
back to the pool until it has run short :data:`SHORT_STREAK` times again.
Bodies are run alike on either thread (same runner, limits, fencing).
"""

from __future__ import annotations

__all__ = ["SHORT_BODY_S", "SHORT_STREAK", "Pace", "ShortBodies"]

#: A body that returns within this many seconds is short: the longest the
#: consume loop is meant to take nothing while it runs one (a prefetched
#: message waits at most about that long; on RabbitMQ a consume loop
#: round lasts up to its wait period anyway).
SHORT_BODY_S = 0.001

#: Short runs in a row (on any thread) before a class's bodies run on the
#: consume loop's thread: its first runs, and the first after a long one,
#: are on the pool.
SHORT_STREAK = 3


class ShortBodies:
    """Remembers, per (task class, action), how many bodies in a row ran short.

    Updated from every thread that ran a body without a lock: a lost update
    only delays or advances the switch by a request, which is harmless.
    """

    def __init__(self, short_s: float | None = None, streak: int = SHORT_STREAK) -> None:
        # None: SHORT_BODY_S as it is when the worker starts (tests widen it).
        self._short_s = SHORT_BODY_S if short_s is None else short_s
        self._streak = streak
        self._runs: dict[tuple[str, str], int] = {}

    def record(self, task_cls: str, action: str, elapsed_s: float) -> None:
        """A body of ``task_cls``'s ``action`` ran for ``elapsed_s`` seconds."""
        key = (task_cls, action)
        if elapsed_s < self._short_s:
            self._runs[key] = self._runs.get(key, 0) + 1
        else:
            self._runs[key] = 0

    def is_short(self, task_cls: str, action: str) -> bool:
        """Whether the last runs of ``task_cls``'s ``action`` were all short."""
        return self._runs.get((task_cls, action), 0) >= self._streak


class Pace:
    """Tells a chain's next request (sent after the last was done) from a burst's (queued).

    One consume loop's (used by its thread only). Two requests of one engine
    were sent ``d`` apart on the engine's clock (header ``enqueued``); when
    the loop spent ``b`` on the first (from taking it until it was run or
    handed over) and ``d >= b``, the second cannot have waited for the loop:
    the loop would not run a burst's requests one after another while the
    pool's threads sit idle. Only differences of one clock are compared, so
    the hosts' clocks never are; requests without ``enqueued`` (TaskFlow's)
    or from another engine than the last never count as a chain's.
    """

    def __init__(self) -> None:
        self._last: tuple[str, float, float] | None = None

    def follows_last(self, reply_to: str, enqueued: float | None) -> bool:
        """Whether this request was sent after the loop was done with its last one."""
        last = self._last
        return (
            enqueued is not None
            and last is not None
            and last[0] == reply_to
            and enqueued - last[1] >= last[2]
        )

    def took(self, reply_to: str, enqueued: float | None, busy_s: float) -> None:
        """The loop was busy ``busy_s`` with a request (sent at ``enqueued``)."""
        self._last = None if enqueued is None else (reply_to, enqueued, busy_s)
