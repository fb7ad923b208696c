"""Private queues of the filesystem transport: they go away with their process.

A queue that only one process consumes (a worker's private queue) has no
reason to outlive it, yet the file-system "broker" is only files: a process
killed with ``kill -9`` leaves its bindings in the exchange tables, and every
broadcast keeps adding a file for a queue nobody will read. So a process
records each of its private queues with an empty marker file,
``<control folder>/private/<pid>@<host>@<tag>@<queue>``, before binding it;
the live consumers of the same folder look at the markers periodically and,
for a process that is gone, delete its queue: its bindings in every exchange
table, then its message files. A process that closes its channel cleanly
deletes its own.

"Gone" is what the claims of the transport use: a process of this host whose
pid no longer exists. Markers of other hosts are never touched (their
processes cannot be checked from here).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

try:
    import fcntl
except ImportError:  # not POSIX: removals are not serialised (they are idempotent)
    fcntl = None  # type: ignore[assignment]

#: Sub-folder of the control folder holding the markers (not an exchange
#: table name: those all end in ".exchange").
MARKER_FOLDER = "private"

#: This host as written in claim and marker names ("@" separates their fields).
HOST = socket.gethostname().replace("@", "_")

_EXCHANGE_SUFFIX = ".exchange"


def process_gone(pid: int, host: str) -> bool:
    """True when process ``pid`` of ``host`` is known to have exited.

    False for this process, for another host's (cannot be checked) and for a
    pid that exists but belongs to someone else (cannot be signalled).
    """
    if host != HOST or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


class Marker(NamedTuple):
    """A private queue and the process that owns it, as named on disk."""

    pid: int
    host: str
    tag: str
    queue: str

    @property
    def name(self) -> str:
        """File name of the marker."""
        return f"{self.pid}@{self.host}@{self.tag}@{self.queue}"

    @classmethod
    def parse(cls, name: str) -> Marker | None:
        """The marker named ``name``, or None for a file that is not one."""
        try:
            pid, host, tag, queue = name.split("@", 3)
            return cls(int(pid), host, tag, queue)
        except ValueError:
            return None

    def gone(self) -> bool:
        """True when the owning process has exited."""
        return process_gone(self.pid, self.host)


def marker_folder(control: Path) -> Path:
    """Folder of the markers under the control folder ``control``."""
    return control / MARKER_FOLDER


def markers(control: Path) -> list[Marker]:
    """Every marker under ``control`` (none when the folder does not exist)."""
    try:
        names = os.listdir(marker_folder(control))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ChannelError(f"Cannot list {marker_folder(control)}: {e}") from e
    found = (Marker.parse(n) for n in names if n[0] != ".")
    return [m for m in found if m is not None]


# Markers this process wrote, with how many channels marked each: two
# channels of one process may mark the same queue, and the first one closed
# must not delete it under the other.
_OWN: dict[Path, int] = {}
_OWN_LOCK = threading.Lock()


def mark(control: Path, queue: str, tag: str) -> Path:
    """Record that this process owns ``queue``; returns the marker path."""
    path = marker_folder(control) / Marker(os.getpid(), HOST, tag, queue).name
    with _OWN_LOCK:
        if not _OWN.get(path):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
            except OSError as e:
                raise ChannelError(f"Cannot mark queue {queue!r} private: {e}") from e
        _OWN[path] = _OWN.get(path, 0) + 1
    return path


def unmark(path: Path) -> bool:
    """One channel lets go of ``path``; True when it was the last of this process.

    False in a forked child: the marker (and the queue) belong to the parent.
    """
    marker = Marker.parse(path.name)
    if marker is None or marker.pid != os.getpid():
        return False
    with _OWN_LOCK:
        left = _OWN.get(path, 0) - 1
        if left > 0:
            _OWN[path] = left
            return False
        _OWN.pop(path, None)
    return True


@contextlib.contextmanager
def removing(control: Path, marker: Marker) -> Iterator[bool]:
    """Hold ``marker`` while its queue is removed; yields False if someone else is.

    The marker is deleted when the block ends without an error, last, so a
    remover that dies half-way leaves it for another. A lock held by a dead
    remover is released by the kernel.
    """
    path = marker_folder(control) / marker.name
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False  # already removed
        return
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False  # another consumer is removing it
                return
        if os.fstat(fd).st_nlink == 0:
            yield False  # removed while we waited for the lock
            return
        yield True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    finally:
        os.close(fd)


def live_owner(control: Path, queue: str, besides: Marker) -> bool:
    """True when a process other than ``besides``'s may still own ``queue``.

    A worker started again with the same worker id declares the same private
    queue: the dead one's marker must not take the new one's bindings away.
    """
    return any(m.queue == queue and m != besides and not m.gone() for m in markers(control))


def unbind(control: Path, marker: Marker) -> int | None:
    """Remove every binding of ``marker.queue``; how many, or None if it has a live owner.

    Each exchange table is rewritten under its lock, as bindings are added,
    and the owner check is repeated under that lock: a new owner writes its
    marker before it binds, so either it is seen here or its binding comes
    after ours is removed.
    """
    removed = 0
    try:
        tables = sorted(n for n in os.listdir(control) if n.endswith(_EXCHANGE_SUFFIX))
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise ChannelError(f"Cannot list {control}: {e}") from e
    for name in tables:
        try:
            f = open(control / name, "rb+", buffering=0)  # noqa: SIM115 - locked below
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ChannelError(f"Cannot open {control / name}") from e
        with f:
            filesystem.lock(f, filesystem.LOCK_EX)
            try:
                raw = f.read()
                table = loads(bytes_to_str(raw)) if raw.strip() else []
                kept = [entry for entry in table if entry[2] != marker.queue]
                if len(kept) == len(table):
                    continue
                if live_owner(control, marker.queue, marker):
                    return None
                f.seek(0)
                f.write(str_to_bytes(dumps(kept)))
                f.truncate()
                removed += len(table) - len(kept)
            finally:
                filesystem.unlock(f)
    return removed
