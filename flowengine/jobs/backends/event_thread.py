"""A thread that receives a board server's notifications and survives reconnections.

Redis pub/sub and PostgreSQL LISTEN both need a connection of their own
that blocks waiting for messages. :class:`EventThread` owns that loop for
any backend: it opens the listening connection (``open``), blocks in
``receive`` for the next batch of messages, and when the connection breaks
it waits ``RECONNECT_DELAY_S`` and opens a new one, delivering a RESYNC
event each time it is (re)subscribed, because messages sent while it was
away are gone and waiters must look again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from flowengine.jobs.store import BoardEvent, EventKind

__all__ = ["RECONNECT_DELAY_S", "SUBSCRIBE_TIMEOUT_S", "EventThread"]

LOG = logging.getLogger(__name__)

#: Pause between attempts to re-open a broken listening connection: short
#: enough that a restarted server is noticed within a second, long enough
#: not to hammer one that is down.
RECONNECT_DELAY_S = 0.5
#: How long connect() waits for the first subscription to be confirmed.
SUBSCRIBE_TIMEOUT_S = 10.0


class EventThread:
    """Runs ``receive(handle)`` forever on a fresh ``open()`` after each failure.

    ``open()`` returns a handle once subscribed (raising ``errors`` when the
    server is unreachable); ``receive(handle)`` blocks and returns the raw
    messages that arrived; ``decode(raw)`` turns one into a BoardEvent (or
    None to ignore it); ``shut(handle)`` closes it, also from another thread
    to unblock ``receive``.
    """

    def __init__(
        self,
        name: str,
        open: Callable[[], Any],
        receive: Callable[[Any], Iterable[Any]],
        shut: Callable[[Any], None],
        decode: Callable[[Any], BoardEvent | None],
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self._name = name
        self._open, self._receive, self._shut, self._decode = open, receive, shut, decode
        self._errors = errors
        self._callbacks: list[Callable[[BoardEvent], None]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._handle: Any = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver events to ``callback`` too."""
        self._callbacks.append(callback)

    def start(self) -> bool:
        """Start the thread; True once subscribed (False after SUBSCRIBE_TIMEOUT_S)."""
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"flowengine-board-events-{self._name}"
        )
        self._thread.start()
        return self._ready.wait(SUBSCRIBE_TIMEOUT_S)

    def stop(self) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._close_quietly(handle)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _close_quietly(self, handle: Any) -> None:
        try:
            self._shut(handle)
        except Exception as e:  # already broken: nothing to release
            LOG.debug("Closing the event connection of board %s failed: %s", self._name, e)

    def _deliver(self, event: BoardEvent) -> None:
        for callback in list(self._callbacks):
            try:
                callback(event)
            except Exception:
                LOG.exception("A board event handler failed on %s", event)

    def _run(self) -> None:
        broken = False
        while not self._stop.is_set():
            try:
                handle = self._open()
            except self._errors as e:
                if not broken:
                    LOG.warning(
                        "Board %s: cannot listen for events (%s); retrying every %.1f s",
                        self._name,
                        e,
                        RECONNECT_DELAY_S,
                    )
                broken = True
                self._stop.wait(RECONNECT_DELAY_S)
                continue
            with self._lock:
                if self._stop.is_set():
                    self._close_quietly(handle)
                    return
                self._handle = handle
            if broken:
                LOG.info("Board %s: listening for events again", self._name)
            broken = False
            self._ready.set()
            self._deliver(BoardEvent(EventKind.RESYNC))
            try:
                while not self._stop.is_set():
                    for raw in self._receive(handle):
                        event = self._decode(raw)
                        if event is not None:
                            self._deliver(event)
            except self._errors as e:
                if not self._stop.is_set():
                    LOG.warning("Board %s: event connection lost (%s); reconnecting", self._name, e)
                    broken = True
            except Exception as e:  # closed under us by stop(): any error ends it
                if not self._stop.is_set():
                    LOG.warning(
                        "Board %s: event connection failed (%s); reconnecting", self._name, e
                    )
                    broken = True
            with self._lock:
                if self._handle is handle:
                    self._handle = None
            self._close_quietly(handle)
            if broken:
                self._stop.wait(RECONNECT_DELAY_S)
