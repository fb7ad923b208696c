"""Names unique across processes, without a random number per message.

kombu's virtual channels tag every message they publish with a fresh uuid4:
about 3 us, and ``os.urandom`` lets go of the interpreter lock, so on a busy
process each publication is also a point where another thread may take the
lock over. A delivery tag only has to be unique among the messages a
consumer can hold at once, from any process writing to the same broker state
(a process's memory, a shared folder); the filesystem transport's file names
likewise. So this process draws a tag once (its pid and a random part: a pid
alone repeats across hosts sharing a folder, and after reuse) and counts
after it. A forked child draws its own: with its parent's, both would hand
out the same names.

The names hold only ``[0-9a-f-]``: they go into file names whose fields are
separated by ``.``, ``_`` and ``@``.
"""

from __future__ import annotations

import itertools
import os
import uuid

__all__ = ["next_tag", "process_tag"]


class _ProcessTag:
    """This process's tag and the counter after it."""

    def __init__(self) -> None:
        self.renew()
        os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        """A tag of this process's own, and the counter starting again."""
        self.tag = f"{os.getpid():x}-{uuid.uuid4().hex[:12]}"
        self._counter = itertools.count(1)

    def next(self) -> str:
        """The tag, then the next count (thread-safe: ``next`` on a count is atomic)."""
        return f"{self.tag}-{next(self._counter):x}"


_PROCESS = _ProcessTag()


def process_tag() -> str:
    """This process's tag: the part every name of :func:`next_tag` starts with."""
    return _PROCESS.tag


def next_tag() -> str:
    """A name no other call in any process gets (thread-safe)."""
    return _PROCESS.next()
