"""One delivery at a time: what arrives while a message is handled waits its turn.

py-amqp hands a consumer its deliveries from inside any read of the
connection, and a consume loop's handlers read it too: a dead letter's
declarations wait for the broker's answers, and every publication first
polls for broker notices. A delivery read there would be handled inside
the handler of the message before it: out of order, with that message's
state still in hand. Worse, py-amqp's wait for a method's answer is not
re-entrant: nested waits for the same answer on one channel can lose one
(the dispatch takes the innermost waiter off and puts the outer one back
only when the inner wait ends, so an answer arriving in between finds
nobody). The outer handler then waits for ever, sends no heartbeat, and
the broker drops the connection a minute later with everything in flight
on it. So a delivery that arrives while another is being handled is kept,
and handled in arrival order once that one is settled.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

__all__ = ["InTurn"]


class InTurn:
    """Runs handlers one at a time; a call made during one runs after it, in order.

    Used by one thread (a consume loop's). When a handler raises, the calls
    still waiting are dropped: they came on the connection the loop is about
    to replace, whose broker gives unacknowledged messages again.
    """

    def __init__(self) -> None:
        self._busy = False
        self._waiting: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque()
        )
        #: Calls that had to wait for another's end so far (tests, stats).
        self.deferred_count = 0

    def run(self, handler: Callable[..., None], *args: Any) -> None:
        """Call ``handler(*args)`` now, or after the handler under way (and those before)."""
        if self._busy:
            self._waiting.append((handler, args))
            self.deferred_count += 1
            return
        self._busy = True
        try:
            handler(*args)
            while self._waiting:
                handler, args = self._waiting.popleft()
                handler(*args)
        finally:
            self._busy = False
            self._waiting.clear()
