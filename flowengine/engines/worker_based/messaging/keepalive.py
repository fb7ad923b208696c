"""Keeping a consumer's AMQP connection alive while its loop takes no message.

py-amqp sends and checks heartbeats only when its owner asks
(``heartbeat_check()``), and only the consume loop's thread may use its
connection. A worker that is full stops taking messages until one of its
requests finishes, which can take longer than two heartbeat intervals: if
the loop then waited without saying anything, the broker would take the
connection for dead and reset it (returning the message it had pushed
ahead). So while the loop waits for room it calls :meth:`Keepalive.beat`
between short waits, in its own thread: a heartbeat frame goes out every
half interval, as py-amqp would send it. Nothing is read meanwhile (a read
could deliver a message the worker has no room for); what the broker sent
is read, and its heartbeats checked, once the loop drains again.
"""

from __future__ import annotations

import time
from typing import Any

from kombu.connection import Connection

__all__ = ["HEARTBEATS_PER_INTERVAL", "Keepalive"]

#: Heartbeat frames sent per negotiated interval while paused: py-amqp's own
#: rate (kombu's default ``heartbeat_check(rate=2)``), so the broker, which
#: allows two intervals of silence, always sees one in time.
HEARTBEATS_PER_INTERVAL = 2


class Keepalive:
    """Sends heartbeat frames on ``conn`` while its consume loop does not drain it.

    A no-op on transports without heartbeats (Redis, filesystem, memory) and
    on AMQP connections that negotiated none.
    """

    def __init__(self, conn: Connection) -> None:
        raw: Any = conn.connection if conn.supports_heartbeats else None
        interval = float(getattr(raw, "heartbeat", 0) or 0)
        self._send = getattr(raw, "send_heartbeat", None) if interval > 0 else None
        #: Seconds between two frames (None: nothing to send).
        self.period_s: float | None = (
            interval / HEARTBEATS_PER_INTERVAL if self._send is not None else None
        )
        self._last = time.monotonic()

    def beat(self) -> None:
        """Send a heartbeat frame if one is due (raises the socket's error if it broke)."""
        if self._send is None or self.period_s is None:
            return
        now = time.monotonic()
        if now - self._last >= self.period_s:
            self._send()
            self._last = now
