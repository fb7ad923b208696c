"""Waking a filesystem consumer when files land in its folders: inotify, else polling.

kombu's filesystem transport polls its folders once a second; a
:class:`FolderWatcher` sleeps on inotify instead (Linux), so a message is
read the moment it is renamed into place. Where inotify is missing it sleeps
FALLBACK_POLL_S at a time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import time
import weakref
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
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_INOTIFY_READ_BYTES = 64 * 1024


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
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(folder),
                                     _IN_MOVED_TO | _IN_CLOSE_WRITE)
        if wd < 0:
            LOG.debug("inotify_add_watch(%s) failed (errno %s); polling it",
                      folder, ctypes.get_errno())
            return
        self._watched.add(folder)

    def clear(self) -> None:
        """Forget pending events (call before looking at the folders)."""
        if self._fd < 0:
            return
        try:
            while os.read(self._fd, _INOTIFY_READ_BYTES):
                pass
        except BlockingIOError:
            pass

    def wait(self, timeout: float) -> None:
        """Sleep until a watched folder changes or ``timeout`` seconds pass."""
        if self._fd < 0:
            time.sleep(min(timeout, FALLBACK_POLL_S))
            return
        select.select([self._fd], [], [], min(timeout, IDLE_RECHECK_S))

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self._finalizer is not None:
            self._finalizer()
        self._fd = -1
