"""In-memory kombu transport that wakes consumers when a message is put.

kombu's ``memory`` transport sleeps ``polling_interval`` (1 s) whenever its
queues are empty, so an in-process request/reply costs up to a second per
hop. This subclass shares kombu's queues and bindings (it interoperates with
plain ``memory://`` connections in the same process) and blocks on a
condition variable that every put notifies, so delivery is immediate and an
idle consumer costs nothing.
"""

from __future__ import annotations

import threading
import time
from queue import Empty
from typing import Any

from kombu.transport import memory

#: Longest idle wait (s) between two looks at the queues even when nothing
#: was signalled: a safety net for messages put through kombu's own memory
#: transport (which does not signal); signalled puts are seen at once.
IDLE_RECHECK_S = 0.05


class _Activity:
    """A generation counter bumped (and broadcast) on every put."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._generation = 0

    @property
    def generation(self) -> int:
        """The current generation (read before looking at the queues)."""
        return self._generation

    def bump(self) -> None:
        """Record a put and wake every waiting consumer."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait_past(self, generation: int, timeout: float) -> None:
        """Block until the generation moves past ``generation`` or ``timeout`` passes."""
        with self._cond:
            if self._generation == generation:
                self._cond.wait(timeout)


ACTIVITY = _Activity()


class Channel(memory.Channel):
    """Memory channel that signals consumers on every put."""

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        super()._put(queue, message, **kwargs)
        ACTIVITY.bump()

    def _put_fanout(self, exchange: str, message: Any, routing_key: str | None = None,
                    **kwargs: Any) -> None:
        super()._put_fanout(exchange, message, routing_key, **kwargs)
        ACTIVITY.bump()


class Transport(memory.Transport):
    """Memory transport whose drain_events blocks on puts instead of polling."""

    Channel = Channel
    # Same broker state as kombu's memory transport: same exchanges/bindings.
    global_state = memory.Transport.global_state
    polling_interval = IDLE_RECHECK_S
    driver_name = "flowengine-memory"

    def drain_events(self, connection: Any, timeout: float | None = None,
                     **kwargs: Any) -> None:
        """Deliver one message, waiting (without polling) up to ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        assert self.cycle is not None  # kombu sets it up with the transport
        get = self.cycle.get
        while True:
            generation = ACTIVITY.generation
            try:
                get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            wait = self.polling_interval or IDLE_RECHECK_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                wait = min(wait, remaining)
            ACTIVITY.wait_past(generation, wait)
