"""Keeping the garbage collector off the objects that outlive an engine run.

When a run starts, the flow, its compilation and its storage already exist
and live at least until it ends; a run of a 100,000-task flow holds a few
million such objects. CPython's full collections, triggered as the run
allocates, walk all of them each time (about half a second each at that
size) and can find nothing to free among them. :func:`frozen_heap` moves
what exists to the collector's permanent generation for the duration of a
block (:func:`gc.freeze`), so collections only walk what the block
allocated; objects made inside are collected as usual. Anything frozen that
became garbage meanwhile is collected after the block.

Blocks may nest and run in several threads at once: the heap is frozen when
the first starts and released when the last ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the objects that exist now for the collector until the block ends."""
    global _depth
    with _lock:
        if _depth == 0:
            gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.unfreeze()
