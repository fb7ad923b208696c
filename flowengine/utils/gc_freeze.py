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

Blocks that only build long-lived library structures (a graph flow's
edges, an engine's atom details) and run no user code can go further:
:func:`collector_paused` turns the collector off for the block, since every
collection during it walks what the block just made and frees none of it
(building a 100,000-task graph flow spends a third of its time so).

Blocks may nest and run in several threads at once: the heap is frozen (the
collector paused) when the first starts and released when the last ends.

All of this is off unless the process allows it: the collector belongs to
the application hosting flowengine, and ``gc.unfreeze()`` releases *every*
frozen object, the host's too (a host that had frozen 16,265 objects had 0
after one run). :func:`allow_tuning` (or ``FLOWENGINE_GC_TUNING=1``) turns
it on for a process that wants it; flowengine's own command line does, as it
owns its process. Without it both blocks leave the collector alone.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

#: Environment variable allowing the tuning in a process (``1``, ``true``, ``yes``).
TUNING_ENV = "FLOWENGINE_GC_TUNING"

_lock = threading.Lock()
_allowed = os.environ.get(TUNING_ENV, "").strip().lower() in ("1", "true", "yes")
_depth = 0
_paused_depth = 0
_paused_was_enabled = False


def allow_tuning(allowed: bool = True) -> None:
    """Let flowengine freeze the heap around runs and pause the collector in builds.

    For a process that owns its collector (flowengine's command line calls
    it): a host application's frozen objects are released after each run.
    """
    global _allowed
    _allowed = allowed


def tuning_allowed() -> bool:
    """Whether :func:`frozen_heap` and :func:`collector_paused` act in this process."""
    return _allowed


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the objects that exist now for the collector until the block ends."""
    global _depth
    if not _allowed:
        yield
        return
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


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Turn automatic collection off until the block ends (if it was on when the first began).

    Only for blocks making objects that outlive them and hold no garbage
    cycles: anything collectable made meanwhile (by other threads too)
    waits for the next collection after the block.
    """
    global _paused_depth, _paused_was_enabled
    if not _allowed:
        yield
        return
    with _lock:
        if _paused_depth == 0:
            _paused_was_enabled = gc.isenabled()
            gc.disable()
        _paused_depth += 1
    try:
        yield
    finally:
        with _lock:
            _paused_depth -= 1
            if _paused_depth == 0 and _paused_was_enabled:
                gc.enable()
