"""Waking the main thread from a wait, even for a signal another thread received."""

from __future__ import annotations

import select
import signal
import socket


class Waker:
    """Wakes the main thread from a wait, also for a signal another thread received.

    CPython runs signal handlers in the main thread, but the kernel may
    deliver a signal to any thread: a main thread blocked on a lock would
    then sleep through it. Waiting in select() on a socket that is also the
    signal wakeup fd always returns, so the handler runs.
    """

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)

    def install(self) -> None:
        """Make every signal wake the waiter (call from the main thread)."""
        signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)

    def wake(self) -> None:
        """Wake the waiter (from any thread)."""
        try:
            self._write.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a full buffer already wakes it

    def wait(self, timeout: float | None) -> None:
        """Block until woken (or ``timeout`` seconds), then forget the wake-ups."""
        select.select([self._read], [], [], timeout)
        try:
            while self._read.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
