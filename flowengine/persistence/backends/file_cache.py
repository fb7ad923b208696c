"""A bounded cache of file contents, for the directory backend's reads.

Each entry remembers which version of the file it holds (inode, mtime,
size): the backend replaces files by renaming new ones in, so another
process's write always shows as a new version and is never served stale.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict


class FileCache:
    """Contents of recently read files, least recently used dropped first.

    ``maxsize`` None: no bound (TaskFlow's default for the dir backend).
    """

    def __init__(self, maxsize: int | None = None) -> None:
        if maxsize is not None and (
            isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1
        ):
            raise ValueError(f"max_cache_size must be a positive integer or None, not {maxsize!r}")
        self.maxsize = maxsize
        self._entries: OrderedDict[str, tuple[tuple[int, int, int], bytes]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def currsize(self) -> int:
        """How many files are cached now."""
        return len(self._entries)

    def read(self, path: str) -> bytes:
        """The contents of ``path``, from the cache when the file did not change.

        Raises FileNotFoundError (and other OSErrors) as reading would.
        """
        st = os.stat(path)
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._entries.get(path)
            if cached is not None and cached[0] == version:
                self._entries.move_to_end(path)
                return cached[1]
        with open(path, "rb") as fp:
            data = fp.read()
        with self._lock:
            self._entries[path] = (version, data)
            self._entries.move_to_end(path)
            while self.maxsize is not None and len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return data

    def forget(self, path: str) -> None:
        """Drop ``path`` (it was deleted)."""
        with self._lock:
            self._entries.pop(path, None)
