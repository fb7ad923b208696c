"""The filesystem transport's files: where they live, how they are named, written and read.

A message folder holds one file per message, ``<stamp>_<tag>.<queue>.msg``
(``<stamp>`` a per-process strictly increasing nanosecond sequence, so names
sort in write order), and three hidden subfolders:

* ``.writing``: files being written, renamed into place when complete;
* ``.claims``: messages a consumer took and has not acknowledged yet, named
  ``.claim-<pid>@<host>@<tag>@<message file name>``, so any consumer of the
  same host can tell whether the taker is alive and where the message goes
  back to;
* ``.own/<queue>``: the messages of a private queue, listed and watched by
  its owner only.

The binding tables (``<exchange>.exchange``) live in the control folder, see
filesystem_bindings.py; the private queues' markers below it, see
filesystem_private.py.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kombu.exceptions import ChannelError

from flowengine.engines.worker_based.transports import filesystem_private as fp
from flowengine.engines.worker_based.transports import tags

LOG = logging.getLogger(__name__)

MSG_SUFFIX = ".msg"
# Bytes per read of a message file: most messages in one read.
_READ_CHUNK_BYTES = 65536
TMP_PREFIX = ".tmp-"
# Subfolder of the message folder where files are written before being
# renamed into place (same file system, so the rename stays atomic).
WRITING_FOLDER = ".writing"
# Subfolder of the message folder holding claimed files until acknowledged.
# Not watched: a claim would otherwise wake every consumer of the folder.
CLAIMS_FOLDER = ".claims"
CLAIM_PREFIX = ".claim-"
# Subfolder of the message folder holding one folder per private queue.
_OWN_FOLDERS = ".own"
#: Queue names that may name a folder of their own (others stay in the
#: message folder): no separator, no leading dot.
_SAFE_QUEUE_FOLDER = re.compile(r"[A-Za-z0-9_@:+=-][A-Za-z0-9._@:+=-]*")

#: Where messages and bindings live when no folder option is given: one
#: folder per user of this machine, so ``filesystem://`` alone works between
#: processes of one machine.
DEFAULT_DATA_FOLDER = os.path.join(tempfile.gettempdir(), f"flowengine-filesystem-{os.getuid()}")


class Sequence:
    """Strictly increasing nanosecond stamps; writes are made visible in stamp order."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        """A lock of this process's own: a forked child's copy may be held
        by a thread of the parent that the child does not have."""
        self.lock = threading.Lock()
        self._last = 0

    def next(self) -> int:
        """Next stamp (lock held by caller)."""
        stamp = time.monotonic_ns()
        if stamp <= self._last:
            stamp = self._last + 1
        self._last = stamp
        return stamp


#: This process's stamps of message file names.
SEQUENCE = Sequence()
os.register_at_fork(after_in_child=SEQUENCE.renew)


def queue_of(name: str) -> str | None:
    """The queue of message file ``name`` (``<stamp>.<queue>.msg``); None for other files.

    Temporary files and claims start with a dot.
    """
    if not name or name[0] == ".":
        return None
    rest = name.partition(".")[2]
    return rest[: -len(MSG_SUFFIX)] if rest.endswith(MSG_SUFFIX) else None


def message_of(queues: set[str]) -> Callable[[str], bool]:
    """Whether a file name is that of a message of one of ``queues``."""
    return lambda name: queue_of(name) in queues


def claim_name(name: str) -> str:
    """The name this process gives its claim of message file ``name``."""
    return f"{CLAIM_PREFIX}{os.getpid()}@{fp.HOST}@{tags.next_tag()}@{name}"


def dead_claim_target(claim: str) -> str | None:
    """The original name of a claim whose owner process is gone, else None."""
    try:
        pid, host, _tag, name = claim[len(CLAIM_PREFIX) :].split("@", 3)
        owner = int(pid)
    except ValueError:
        return None  # not one of ours: leave it alone
    return name if fp.process_gone(owner, host) else None


def own_folder(messages: str, queue: str) -> str | None:
    """The folder of private queue ``queue`` in message folder ``messages``; None if unnameable."""
    if not _SAFE_QUEUE_FOLDER.fullmatch(queue):
        return None
    return os.path.join(messages, _OWN_FOLDERS, queue)


def option_folder(options: Mapping[str, object], key: str, sub: str) -> str:
    """An explicit folder option, else ``data_folder``/sub, else one shared default.

    kombu's defaults (``data_in`` and ``data_out`` in the current
    directory) are two different folders, so processes using them never
    hear each other; without any folder option every process of this
    user on this machine shares DEFAULT_DATA_FOLDER instead.
    """
    if options.get(key):
        return str(options[key])
    return os.path.join(str(options.get("data_folder") or DEFAULT_DATA_FOLDER), sub)


def control_folder(options: Mapping[str, object]) -> Path:
    """Folder of the exchange -> queue tables.

    Default: ``control`` beside (or inside) the message folders, at the
    path both sides share, instead of kombu's ``control`` relative to the
    current directory: processes started from different directories
    must see the same bindings, or messages are silently dropped.
    """
    if not options.get("control_folder") and not options.get("data_folder"):
        common = os.path.commonpath(
            [
                os.path.abspath(option_folder(options, "data_folder_in", "messages")),
                os.path.abspath(option_folder(options, "data_folder_out", "messages")),
            ]
        )
        return Path(common) / "control"
    return Path(option_folder(options, "control_folder", "control"))


# Plain descriptors instead of open(): without the io layers a message file
# costs ~15 us less to write and to read, and each task writes three.
def write_new_file(path: str, data: bytes) -> None:
    """Create ``path`` (it must not exist) holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    """All of ``path``'s bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, _READ_CHUNK_BYTES):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    """Remove ``path`` if it can be; a file already gone is no error."""
    try:
        os.unlink(path)
    except OSError:
        pass


def list_claims(claims_folder: str) -> list[str]:
    """The claims in ``claims_folder`` (none if it is missing)."""
    try:
        return [name for name in os.listdir(claims_folder) if name.startswith(CLAIM_PREFIX)]
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ChannelError(f"Cannot list {claims_folder!r}: {e}") from e


def purge_files(folder: str, queue: str) -> int:
    """Remove ``queue``'s message files, and dead processes' claims of them."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise ChannelError(f"Cannot list {folder!r}: {e}") from e
    claims_folder = os.path.join(folder, CLAIMS_FOLDER)
    files = itertools.chain(
        ((folder, name) for name in names),
        ((claims_folder, name) for name in list_claims(claims_folder)),
    )
    count = 0
    for where, name in files:
        if where == claims_folder:
            target = dead_claim_target(name)
            if target is None or queue_of(target) != queue:
                continue
        elif queue_of(name) != queue:
            continue
        try:
            os.unlink(os.path.join(where, name))
        except FileNotFoundError:
            continue  # taken or removed meanwhile
        except OSError as e:
            LOG.error("Could not remove message file %s of private queue %r: %s", name, queue, e)
            continue
        count += 1
    return count
