"""Taking requests from several topics in priority order (one worker, several topics).

A worker started with ``--topic high --topic low`` runs one consume loop per
topic, all feeding one pool. Each loop, holding a request it received, waits
for its *turn* before taking it: there must be room (fewer requests held
than the worker's capacity) and no loop of a higher-priority topic may be
waiting with a request of its own. So when both topics have work, the
request of the higher one is taken first, as RQ's ``worker high normal
low`` pops the first non-empty queue; a lower topic gets the room only
while every higher one has nothing waiting.

A loop that waits holds its message unacknowledged (one per queue: the
prefetch is one), which the broker gives to another worker if this one
dies; a stopping worker gives it back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from flowengine.engines.worker_based.worker_side import held as held_mod

#: Longest single wait (s) of a loop waiting for its turn: it re-checks its
#: give-up event at least this often even if nobody wakes it.
TURN_WAIT_SLICE_S = 0.5


class PriorityRoom:
    """Shared by the consume loops of one worker's topics (rank 0 is the highest).

    ``capacity`` is how many requests the worker holds at most, counted over
    every topic's memory (each built on :attr:`condition`, so that a request
    leaving any of them wakes the waiting loops).
    """

    def __init__(self, capacity: int, ranks: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.condition = threading.Condition()
        self._waiting = [0] * ranks
        self._memories: list[held_mod.RequestMemory] = []

    def memory(self) -> held_mod.RequestMemory:
        """A new request memory counted by this room (one per topic)."""
        memory = held_mod.RequestMemory(condition=self.condition)
        self._memories.append(memory)
        return memory

    @property
    def held(self) -> int:
        """Requests held over every topic."""
        with self.condition:
            return sum(len(m) for m in self._memories)

    @property
    def waiting(self) -> Sequence[int]:
        """How many loops of each rank wait for their turn now."""
        with self.condition:
            return tuple(self._waiting)

    def wait_for_space(self, give_up: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until at most ``capacity`` requests are held.

        A consume loop asks before it takes a message, as a one-topic worker
        does (bounded prefetch). At capacity a loop still takes one message
        and waits for its turn with it in hand (admit(), keeping its
        connection alive): that is how the room knows which topics have work,
        and so which goes first. True when there is room or ``give_up`` is set.
        """
        deadline = time.monotonic() + timeout_s
        with self.condition:
            while not give_up.is_set():
                if sum(len(m) for m in self._memories) <= self.capacity:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.condition.wait(min(left, TURN_WAIT_SLICE_S))
            return True

    def admit(
        self,
        rank: int,
        memory: held_mod.RequestMemory,
        give_up: threading.Event,
        key: held_mod.Key,
        reply_to: str,
        attempt: int | None,
        expires: float | None,
        announced: bool,
        *,
        loss_bound: tuple[int | None, float | None] = (None, None),
        pause: Callable[[], None] | None = None,
    ) -> held_mod.Verdict | None:
        """Wait for the turn of ``rank``, then admit the request into ``memory``.

        Admitted under the room's lock, so two loops can never both take the
        last free place. None when ``give_up`` was set first (the worker
        stops: give the message back). ``pause()`` is called between waits
        (the loop's connection keepalive: this wait runs inside a handler).
        """
        with self.condition:
            self._waiting[rank] += 1
            try:
                while not give_up.is_set():
                    held = sum(len(m) for m in self._memories)
                    if held < self.capacity and not any(self._waiting[:rank]):
                        return memory.admit(
                            key,
                            reply_to,
                            attempt,
                            expires,
                            announced=announced,
                            loss_bound=loss_bound,
                        )
                    self.condition.wait(TURN_WAIT_SLICE_S)
                    if pause is not None:
                        pause()
                return None
            finally:
                self._waiting[rank] -= 1
                self.condition.notify_all()
