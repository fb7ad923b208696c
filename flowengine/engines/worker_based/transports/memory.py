"""In-memory kombu transport that wakes a queue's consumers when a message is put.

kombu's ``memory`` transport sleeps ``polling_interval`` (1 s) whenever its
queues are empty, so an in-process request/reply costs up to a second per
hop. This subclass shares kombu's queues and bindings (it interoperates with
plain ``memory://`` connections in the same process) and blocks on a
condition variable of its own that a put to one of the queues it consumes
notifies, so delivery is immediate, an idle consumer costs nothing, and a
put wakes only the consumers of that queue (not every consumer of the
process, which made each message cost a dozen thread wake-ups) -- and of
those, when one sleeps ready to take it, that one alone: the others would
wake only to find the queue empty again.
"""

from __future__ import annotations

import threading
import time
from queue import Empty
from typing import Any

from kombu.transport import memory

from flowengine.engines.worker_based.transports import tags

#: Longest idle wait (s) between two looks at the queues even when nothing
#: was signalled: a safety net for messages put through kombu's own memory
#: transport (which does not signal); signalled puts are seen at once.
IDLE_RECHECK_S = 0.05


class _Waiter:
    """One transport's wake-up: a generation counter bumped on puts to its queues."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self.generation = 0
        #: True while the transport sleeps in wait_past() able to take a
        #: message from any queue it consumes; the registry clears it when it
        #: picks this waiter for a put, so the next put picks another.
        self.ready = False

    def bump(self) -> None:
        """Record a put and wake the transport if it waits."""
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait_past(self, generation: int, timeout: float, ready: bool) -> None:
        """Block until the generation moves past ``generation`` or ``timeout`` passes.

        ``ready``: the transport can take a message from each queue it
        consumes now (none of its channels is at its prefetch limit).
        """
        with self._cond:
            if self.generation == generation:
                self.ready = ready
                try:
                    self._cond.wait(timeout)
                finally:
                    self.ready = False


class _Registry:
    """Which waiters consume which queue (process-wide, as kombu's memory state is)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_queue: dict[str, set[_Waiter]] = {}

    def watch(self, waiter: _Waiter, old: frozenset[str], new: frozenset[str]) -> None:
        """``waiter`` now consumes ``new`` instead of ``old``."""
        with self._lock:
            for queue in old - new:
                waiters = self._by_queue.get(queue)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._by_queue[queue]
            for queue in new - old:
                self._by_queue.setdefault(queue, set()).add(waiter)

    def wake(self, queue: str) -> None:
        """Wake a consumer of ``queue`` sleeping ready to take a message, else all of them.

        A consumer that is not asleep (busy, or about to sleep) is bumped so
        that it looks at its queues again before it sleeps: none is picked
        unless it will look.
        """
        with self._lock:
            waiters = self._by_queue.get(queue)
            if not waiters:
                return
            for waiter in waiters:
                if waiter.ready:
                    waiter.ready = False  # picked: the next put wakes another
                    chosen: tuple[_Waiter, ...] = (waiter,)
                    break
            else:
                chosen = tuple(waiters)
        for waiter in chosen:
            waiter.bump()


WAITERS = _Registry()


class Channel(memory.Channel):
    """Memory channel that wakes a queue's consumers on every put.

    Message bodies stay as they are (kombu's virtual channels base64-encode
    them by default, which only a transport that stores text needs).
    Delivery tags come from a counter (see tags.py), not a uuid per message.
    """

    # No encoding: every kombu version (5.3 on) stores and reads the body as
    # it is; "utf-8" would do the same from kombu 5.4 on only.
    body_encoding = None  # type: ignore[assignment]  # kombu infers str

    def _next_delivery_tag(self) -> str:
        return tags.next_tag()

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        waiting = self._queue_for(queue)
        # Most looks find the queue empty (a consumer looks at each of its
        # queues in turn): say so without Queue.get's lock and exception.
        # A put racing with this look bumps the waiter, so it is seen next.
        if not waiting.queue:
            raise Empty()
        return waiting.get(block=False)

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        super()._put(queue, message, **kwargs)
        WAITERS.wake(queue)

    def _put_fanout(
        self, exchange: str, message: Any, routing_key: str | None = None, **kwargs: Any
    ) -> None:
        super()._put_fanout(exchange, message, routing_key, **kwargs)
        for queue in self._lookup(exchange, routing_key):
            WAITERS.wake(queue)

    def _delete(
        self, queue: str, exchange: str | None = None, *binding: Any, **kwargs: Any
    ) -> None:
        """Delete ``queue`` and its binding to ``exchange`` (once per binding).

        kombu's memory transport drops the queue but leaves the exchange's
        table as it was: every message for a binding of a deleted queue
        (each worker announcement, for every engine's reply queue ever
        deleted) would make the queue again and stay in it for ever.
        """
        super()._delete(queue, exchange, *binding, **kwargs)
        if exchange is None or not binding:
            return
        try:
            table = self.get_table(exchange)
        except KeyError:  # an exchange nobody declared here
            return
        table[:] = [entry for entry in table if tuple(entry) != binding]

    def _purge(self, queue: str) -> int:
        """Empty ``queue``; a deleted one has nothing to empty (kombu's would make it again)."""
        if queue not in self.queues:
            return 0
        return int(super()._purge(queue))


class Transport(memory.Transport):
    """Memory transport whose drain_events blocks on puts instead of polling."""

    Channel = Channel
    # Same broker state as kombu's memory transport: same exchanges/bindings.
    global_state = memory.Transport.global_state
    polling_interval = IDLE_RECHECK_S
    driver_name = "flowengine-memory"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiter = _Waiter()
        self._watched: frozenset[str] = frozenset()

    def _watch_consumed_queues(self) -> None:
        """Be woken by puts to the queues this transport's channels consume now."""
        consumed = frozenset(queue for channel in self.channels for queue in channel._active_queues)
        if consumed != self._watched:
            WAITERS.watch(self._waiter, self._watched, consumed)
            self._watched = consumed

    def _can_take_any(self) -> bool:
        """Whether every consuming channel is below its prefetch limit."""
        return all(channel.qos.can_consume() for channel in self.channels if channel._consumers)

    def close_connection(self, connection: Any) -> None:
        WAITERS.watch(self._waiter, self._watched, frozenset())
        self._watched = frozenset()
        super().close_connection(connection)

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        """Deliver one message, waiting (without polling) up to ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        assert self.cycle is not None  # kombu sets it up with the transport
        get = self.cycle.get
        self._watch_consumed_queues()
        while True:
            generation = self._waiter.generation
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
            self._waiter.wait_past(generation, wait, self._can_take_any())
