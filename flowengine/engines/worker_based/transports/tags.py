"""Delivery tags unique across processes, without a random number per message.

kombu's virtual channels tag every message they publish with a fresh uuid4:
about 3 us, and ``os.urandom`` lets go of the interpreter lock, so on a busy
process each publication is also a point where another thread may take the
lock over. A tag only has to be unique among the messages a consumer can
hold at once, from any process writing to the same broker state (a
process's memory, a shared folder): this process's id and a random part
drawn once, then a counter. A forked child draws its own.
"""

from __future__ import annotations

import itertools
import os
import uuid

__all__ = ["next_tag"]


class _Tags:
    """This process's tag prefix and counter."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        """A prefix of this process's own, and a counter starting again."""
        self.prefix = f"{os.getpid():x}.{uuid.uuid4().hex[:12]}."
        self.counter = itertools.count(1)


_TAGS = _Tags()
os.register_at_fork(after_in_child=_TAGS.renew)


def next_tag() -> str:
    """A delivery tag no other message of any process gets (thread-safe)."""
    return f"{_TAGS.prefix}{next(_TAGS.counter)}"
