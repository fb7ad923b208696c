"""Counting the messages that made a consume loop fail, so none is taken again for ever.

A message is settled once its handler returned, whatever happened in it
(see :mod:`.delivery`). What can still give a message back is an error the
loop itself did not expect while the message was in hand: the loop
restarts, the broker delivers the message again, and the same error may
follow. :class:`Strikes` remembers such messages by a fingerprint of what
they carry (a redelivery may have another delivery tag), so that the loop
dead-letters one once it has failed ``limit`` times, instead of taking it
in a tight loop.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

from flowengine.engines.worker_based.messaging.delivery import Delivery

__all__ = ["DEFAULT_MAX_REDELIVERIES", "Strikes"]

#: How many times a message may make the consume loop fail before it is
#: dead-lettered unread (ConsumeOptions.max_redeliveries).
DEFAULT_MAX_REDELIVERIES = 3

#: How many different messages are remembered at most (oldest forgotten first).
REMEMBERED = 1024


class Strikes:
    """How many times each remembered message made the loop fail (only its thread uses it)."""

    def __init__(self, limit: int = DEFAULT_MAX_REDELIVERIES) -> None:
        if limit < 1:
            raise ValueError(f"max_redeliveries must be at least 1, not {limit}")
        self.limit = limit
        self._counts: collections.OrderedDict[bytes, int] = collections.OrderedDict()

    def __bool__(self) -> bool:
        """True while any message is remembered (no fingerprint is computed otherwise)."""
        return bool(self._counts)

    def record(self, delivery: Delivery) -> int:
        """Count one more failure of the loop with ``delivery`` in hand; the count."""
        key = fingerprint(delivery)
        count = self._counts.pop(key, 0) + 1
        self._counts[key] = count
        while len(self._counts) > REMEMBERED:
            self._counts.popitem(last=False)
        return count

    def struck_out(self, delivery: Delivery) -> int:
        """The failures counted for ``delivery`` when they reached the limit, else 0."""
        if not self._counts:
            return 0
        count = self._counts.get(fingerprint(delivery), 0)
        return count if count >= self.limit else 0

    def forget(self, delivery: Delivery) -> None:
        """Forget ``delivery`` (it was settled)."""
        if self._counts:
            self._counts.pop(fingerprint(delivery), None)


def fingerprint(delivery: Delivery) -> bytes:
    """What identifies a message across redeliveries: its routing, ids and body."""
    digest = hashlib.blake2b(digest_size=16)
    info = getattr(delivery.message, "delivery_info", None) or {}
    props = delivery.properties
    for part in (
        info.get("routing_key"),
        props.get("correlation_id"),
        props.get("type"),
        props.get("message_id"),
    ):
        digest.update(_as_bytes(part))
        digest.update(b"\0")
    digest.update(_as_bytes(delivery.body))
    return digest.digest()


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return repr(value).encode("utf-8")
