"""Waking a filesystem consumer when files land in its folders: inotify, else polling.

kombu's filesystem transport polls its folders once a second; a
:class:`FolderWatcher` sleeps on inotify instead (Linux), so a message is
read the moment it is renamed into place. It wakes only for the files its
consumer wants: every process on a folder writes temporary files, claims
and other queues' messages there, and looking at the folder for each of
them cost every consumer a dozen listings per message. Where inotify is
missing it sleeps FALLBACK_POLL_S at a time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

LOG = logging.getLogger(__name__)

#: Polling interval (s) when inotify is not available: short, because every
#: hop of a request/reply pays half of it on average.
FALLBACK_POLL_S = 0.005

#: Longest inotify wait (s) before looking at the folder anyway: a safety net
#: for file systems where inotify misses writes made elsewhere (NFS, ...).
IDLE_RECHECK_S = 0.25

# inotify constants (linux/inotify.h).
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_Q_OVERFLOW = 0x00004000
#: struct inotify_event without its name: wd, mask, cookie, len.
_EVENT = struct.Struct("iIII")
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_INOTIFY_READ_BYTES = 64 * 1024
#: Largest inotify event: the struct and a name of NAME_MAX bytes plus NUL.
_MAX_EVENT_BYTES = _EVENT.size + 256


def _load_libc() -> Any | None:
    """libc with inotify, or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1  # noqa: B018 - probe that the symbol exists
        libc.inotify_add_watch  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()


class FolderWatcher:
    """Wakes a consumer when files land in watched folders (inotify or polling)."""

    def __init__(self) -> None:
        self._fd = -1
        self._watched: set[str] = set()
        self._finalizer: weakref.finalize[[int], FolderWatcher] | None = None
        if _LIBC is not None:
            fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                # Closed even if kombu never closes the connection.
                self._finalizer = weakref.finalize(self, os.close, fd)

    @property
    def active(self) -> bool:
        """True when inotify is in use."""
        return self._fd >= 0

    def watch(self, folder: str) -> None:
        """Watch ``folder`` for new files (no-op without inotify)."""
        if self._fd < 0 or folder in self._watched or _LIBC is None:
            return
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(folder), _IN_MOVED_TO | _IN_CLOSE_WRITE)
        if wd < 0:
            LOG.debug(
                "inotify_add_watch(%s) failed (errno %s); polling it", folder, ctypes.get_errno()
            )
            return
        self._watched.add(folder)

    def wait_for(
        self, wanted: Callable[[str], bool], timeout: float, names: set[str] | None = None
    ) -> None:
        """Sleep until a file whose name ``wanted`` accepts lands, or ``timeout`` s pass.

        Events about other files are read and passed over; the names of
        wanted ones are added to ``names`` (if given). Returns early after
        IDLE_RECHECK_S, or FALLBACK_POLL_S without inotify: the caller then
        looks at the folders anyway.
        """
        if self._fd < 0:
            time.sleep(min(timeout, FALLBACK_POLL_S))
            return
        deadline = time.monotonic() + min(timeout, IDLE_RECHECK_S)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            readable, _, _ = select.select([self._fd], [], [], remaining)
            if not readable or self.landed(wanted, names):
                return

    def landed(self, wanted: Callable[[str], bool], names: set[str] | None = None) -> bool:
        """Read the pending events: True if one is about a wanted file (or events were lost).

        The wanted files' names are added to ``names`` (if given). Without
        inotify there are no events: False.
        """
        if self._fd < 0:
            return False
        found = False
        for buffer in self._pending_events():
            for name in _event_names(buffer):
                if name is None:
                    found = True  # the kernel dropped events: look anyway
                elif wanted(name):
                    found = True
                    if names is not None:
                        names.add(name)
        return found

    def _pending_events(self) -> Iterator[bytes]:
        """Read the queued events, a buffer at a time, until there are none."""
        while True:
            try:
                buffer = os.read(self._fd, _INOTIFY_READ_BYTES)
            except BlockingIOError:
                return
            if buffer:
                yield buffer
            # The kernel returns every whole event that fits: room left for
            # the largest one means the queue was empty, and one read (and
            # the exception of a second) is saved on each wake-up.
            if len(buffer) <= _INOTIFY_READ_BYTES - _MAX_EVENT_BYTES:
                return

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self._finalizer is not None:
            self._finalizer()
        self._fd = -1


def _event_names(buffer: bytes) -> Iterator[str | None]:
    """The file names of a buffer of inotify events (None where the kernel dropped events)."""
    offset = 0
    while offset + _EVENT.size <= len(buffer):
        _wd, mask, _cookie, length = _EVENT.unpack_from(buffer, offset)
        start = offset + _EVENT.size
        offset = start + length
        if mask & _IN_Q_OVERFLOW:
            yield None
        elif length:
            yield os.fsdecode(buffer[start:offset].rstrip(b"\0"))
