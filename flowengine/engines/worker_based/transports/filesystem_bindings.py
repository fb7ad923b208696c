"""The filesystem transport's bindings: one exchange -> queue table file per exchange.

kombu's layout, kept so kombu's own filesystem transport reads the same
tables: ``<control folder>/<exchange>.exchange`` holds a JSON list of
``[routing_key, pattern, queue]``. Every change rewrites the file under an
exclusive lock; readers take a shared one. Every publish looks its
exchange's table up, so a table is cached and read again only when its file
changed.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

#: A binding table read less than this long (ns) after it was changed is
#: read again at its next lookup instead of served from cache: file mtimes
#: only move every few milliseconds.
TABLE_RACY_WINDOW_NS = 100_000_000

#: The wall clock binding tables' mtimes are compared with (tests set it).
_wall_ns = time.time_ns

#: Exchange names the transport turns into file names.
_SAFE_EXCHANGE_NAME = re.compile(r"[A-Za-z0-9._-]+")


class _Table(NamedTuple):
    """A binding table as last read: its file's stat key, its bytes, its entries.

    ``settled``: read when the file had not changed for TABLE_RACY_WINDOW_NS,
    so any later change gives it another stat key.
    """

    key: tuple[int, int, int]
    raw: bytes
    bindings: list[Any]
    settled: bool


def _parse_table(raw: bytes) -> list[Any]:
    """The entries of a binding table file's bytes (none while it is still empty)."""
    if not raw.strip():
        return []
    return [filesystem.exchange_queue_t(*entry) for entry in loads(bytes_to_str(raw))]


class BindingTables:
    """The binding tables of one control folder, as one channel reads and changes them."""

    def __init__(self, control: Path) -> None:
        self.control = control
        self._tables: dict[str, _Table] = {}
        self._paths: dict[str, Path] = {}

    def path(self, exchange: str) -> Path:
        """The file holding ``exchange``'s bindings; ChannelError for an unsafe name.

        The name becomes a file name in the control folder: only characters
        that cannot lead out of it are accepted (letters, digits, ``._-``, not
        all dots), whatever kombu version checks or not. Worked out once per
        exchange: every publish looks its table up.
        """
        file = self._paths.get(exchange)
        if file is not None:
            return file
        if exchange and (not _SAFE_EXCHANGE_NAME.fullmatch(exchange) or not exchange.strip(".")):
            raise ChannelError(
                f"Invalid exchange name for the filesystem transport:"
                f" {exchange!r} (letters, digits, '.', '_' and '-' only)"
            )
        file = self.control / f"{exchange}.exchange"
        if file.parent != self.control:
            raise ChannelError(f"Invalid exchange name: {exchange!r}")
        self._paths[exchange] = file
        return file

    def bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """Add a binding to the exchange table (create-or-update under one lock)."""
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self.control.mkdir(parents=True, exist_ok=True)

        def add(table: list[Any]) -> bool:
            if entry in table:
                return False
            table.insert(0, entry)
            return True

        # Created if missing: two processes binding at once on a fresh folder
        # must not wipe each other's entries.
        self._update(exchange, add, create=True)

    def unbind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """Remove a binding from the exchange table, if it is there."""
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def remove(table: list[Any]) -> bool:
            if entry not in table:
                return False
            table.remove(entry)
            return True

        self._update(exchange, remove, create=False)

    def _update(self, exchange: str, change: Callable[[list[Any]], bool], *, create: bool) -> None:
        """Apply ``change`` to ``exchange``'s binding table under the table file's lock.

        ``change`` edits the list in place and says whether it changed; the
        file is rewritten only then. A missing file is created when ``create``,
        else there is nothing to change.
        """
        file = self.path(exchange)
        try:
            fd = os.open(file, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ChannelError(f"Cannot open {file}") from e
        with os.fdopen(fd, "rb+", buffering=0) as f:
            filesystem.lock(f, filesystem.LOCK_EX)
            try:
                table = _parse_table(f.read())
                if change(table):
                    f.seek(0)
                    f.write(str_to_bytes(dumps(table)))
                    f.truncate()
            finally:
                filesystem.unlock(f)

    def get(self, exchange: str) -> list[Any]:
        """The exchange's bindings, re-read only when the table file changed.

        Every publish looks the table up; a stat is much cheaper than
        open + lock + read + parse, and any binding change rewrites the file
        (new mtime/size). A table changed lately is read again, but parsed
        only if its bytes differ from the cached ones: every engine binds
        its reply queue when it starts, so with engines coming and going
        the table is nearly always recent.
        """
        file = self.path(exchange)
        try:
            st = os.stat(file)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise ChannelError(f"Cannot open {file}") from e
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._tables.get(exchange)
        if cached is not None and cached.key == key and cached.settled:
            return cached.bindings
        # File times are coarse (a few ms): a change right after a read, within
        # the same tick, can leave (size, mtime) as they were. So a cached
        # table is trusted only if it was read when its file had not changed
        # for a while (as git does with its "racy" index entries); until then
        # every lookup reads it again. A later change moves the mtime.
        settled = _wall_ns() - st.st_mtime_ns > TABLE_RACY_WINDOW_NS
        try:
            with open(file, "rb", buffering=0) as f:
                filesystem.lock(f, filesystem.LOCK_SH)
                try:
                    raw = f.read()
                finally:
                    filesystem.unlock(f)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise ChannelError(f"Cannot open {file}") from e
        if cached is not None and cached.raw == raw:
            bindings = cached.bindings
        else:
            try:
                bindings = _parse_table(raw)
            except (ValueError, TypeError) as e:
                raise ChannelError(f"Unreadable binding table {file}: {e}") from e
        self._tables[exchange] = _Table(key, raw, bindings, settled)
        return bindings


class _BrokerStates:
    """kombu's record of declared exchanges and bindings, one per control folder.

    kombu's filesystem transport keeps one for the whole process and skips
    writing a binding it records as declared: a process that declared a
    queue on one folder and then the same queue on another never wrote the
    binding into the second folder's table, and messages published there
    to that queue were dropped. Keyed by the folder the tables live in.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_folder: dict[str, virtual.BrokerState] = {}

    def of(self, control_folder: Path) -> virtual.BrokerState:
        """The record for the binding tables in ``control_folder``."""
        key = os.path.abspath(control_folder)
        with self._lock:
            state = self._by_folder.get(key)
            if state is None:
                state = self._by_folder[key] = virtual.BrokerState()
            return state


#: This process's records, by control folder.
BROKER_STATES = _BrokerStates()
