"""File-system kombu transport that delivers whole messages, in order, promptly.

kombu's ``filesystem`` transport names each message file by the millisecond
it was written, so two messages written in the same millisecond (a RUNNING
then a SUCCESS reply) are read in random order; it writes files in place, so
a reader can pick up a half-written file; it claims files with a move to the
temp folder (a copy, not atomic, when that is another file system); and it
polls every second. This subclass keeps kombu's options and folder layout
(``data_folder_in``, ``data_folder_out``, ``control_folder``,
``store_processed``, ``processed_folder``) and changes how files are handled:

* names start with a per-process strictly increasing nanosecond sequence
  (system-wide monotonic clock), so files sort in write order;
* each file is written under a temporary name in the hidden subfolder
  ``.writing`` and renamed into place (atomic), and one process makes its
  writes visible in sequence order; the subfolder is not watched, so a
  write wakes the consumers once (the rename), not twice;
* a reader claims a file by renaming it into the hidden subfolder
  ``.claims`` (same file system, so atomic: two consumers never both get
  it; unwatched, so a claim wakes nobody) and keeps the claimed file until
  the message is acknowledged; claims left by a process that died (kill -9)
  are put back in the queue by the other consumers, so a message is never
  lost between its delivery and its acknowledgement;
* consumers sleep on inotify (Linux) and wake when a file appears, falling
  back to a short polling interval elsewhere;
* a queue marked private (``Channel.mark_private``) is deleted, bindings and
  messages, when its process closes the channel or dies (see
  filesystem_private.py); one whose messages may be handled twice (a reply
  queue, ``Channel.take_in_batches``) is read without claim files;
* a private queue's messages are written in a subfolder of its own,
  ``.own/<queue>``, which only its owner lists and watches: the replies to
  one engine wake neither the workers nor the other engines. Messages a
  publisher that knows no such folders (kombu's own filesystem transport,
  as a TaskFlow process uses) wrote for it into the message folder are
  moved there.

Extra option ``data_folder``: one folder holding everything (messages/,
control/, processed/) for all processes that share it. Folders are created
when missing.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import re
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from queue import Empty
from typing import Any, NamedTuple

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from flowengine import exceptions as exc
from flowengine.engines.worker_based.transports import contract, inotify, tags
from flowengine.engines.worker_based.transports import filesystem_private as fp
from flowengine.engines.worker_based.transports.envelope import read_envelope

LOG = logging.getLogger(__name__)

#: Listings one _get may make before giving up for this round: a new file
#: needs two (see Channel._ready), a third covers one missed by the first.
SCANS_PER_GET = 3

#: A binding table read less than this long (ns) after it was changed is
#: read again at its next lookup instead of served from cache: file mtimes
#: only move every few milliseconds.
TABLE_RACY_WINDOW_NS = 100_000_000

#: The wall clock binding tables' mtimes are compared with (tests set it).
_wall_ns = time.time_ns

#: How often (s) a consumer looks for claims of dead processes to put back
#: and for their private queues to delete: a crashed worker's unacknowledged
#: message is redelivered within this bound plus one delivery, at the price
#: of one os.kill(pid, 0) per stale claim and per other process's private
#: queue.
RECLAIM_PERIOD_S = 0.5

#: Errors of a full disk (or quota): the folder is unusable until space is
#: freed, then usable again, so they are reported as a broker outage.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

#: Message property carrying the path of the claimed file until ack.
CLAIM_PROPERTY = "x-flowengine-claim"

_MSG_SUFFIX = ".msg"
# Bytes per read of a message file: most messages in one read.
_READ_CHUNK_BYTES = 65536
_TMP_PREFIX = ".tmp-"
# Subfolder of the message folder where files are written before being
# renamed into place (same file system, so the rename stays atomic).
_WRITING_FOLDER = ".writing"
# Subfolder of the message folder holding claimed files until acknowledged.
# Not watched: a claim would otherwise wake every consumer of the folder.
_CLAIMS_FOLDER = ".claims"
_CLAIM_PREFIX = ".claim-"
# Subfolder of the message folder holding one folder per private queue.
_OWN_FOLDERS = ".own"
#: Queue names that may name a folder of their own (others stay in the
#: message folder): no separator, no leading dot.
_SAFE_QUEUE_FOLDER = re.compile(r"[A-Za-z0-9_@:+=-][A-Za-z0-9._@:+=-]*")

#: Where messages and bindings live when no folder option is given: one
#: folder per user of this machine, so ``filesystem://`` alone works between
#: processes of one machine.
DEFAULT_DATA_FOLDER = os.path.join(tempfile.gettempdir(), f"flowengine-filesystem-{os.getuid()}")

#: Exchange names the transport turns into file names.
_SAFE_EXCHANGE_NAME = re.compile(r"[A-Za-z0-9._-]+")


class _Sequence:
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


_SEQUENCE = _Sequence()
os.register_at_fork(after_in_child=_SEQUENCE.renew)
# A claim is named ".claim-<pid>@<host>@<tag>-<n>@<message file name>", so any
# consumer on the same host can tell whether its owner is alive and where it
# goes back to (the original name keeps its place in write order).
_HOST = fp.HOST


def _queue_of(name: str) -> str | None:
    """The queue of message file ``name`` (``<stamp>.<queue>.msg``); None for other files.

    Temporary files and claims start with a dot.
    """
    if not name or name[0] == ".":
        return None
    rest = name.partition(".")[2]
    return rest[:-len(_MSG_SUFFIX)] if rest.endswith(_MSG_SUFFIX) else None


def _claim_name(name: str) -> str:
    return f"{_CLAIM_PREFIX}{os.getpid()}@{_HOST}@{tags.next_tag()}@{name}"


def _dead_claim_target(claim: str) -> str | None:
    """The original name of a claim whose owner process is gone, else None."""
    try:
        pid, host, _tag, name = claim[len(_CLAIM_PREFIX):].split("@", 3)
        owner = int(pid)
    except ValueError:
        return None  # not one of ours: leave it alone
    return name if fp.process_gone(owner, host) else None


class Channel(filesystem.Channel):
    """File-system channel with atomic, ordered, claim-by-rename message files."""

    def _next_delivery_tag(self) -> str:
        # Unique across the processes sharing the folder without a uuid per
        # message (see tags.py).
        return tags.next_tag()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, deque[str]] = {}
        self._seen: dict[str, frozenset[str]] = {}
        self._tables: dict[str, _Table] = {}
        self._exchange_paths: dict[str, Path] = {}
        self._next_reclaim = 0.0
        #: Queues this channel marked private -> their marker file.
        self._private: dict[str, Path] = {}
        #: Private queues this channel reads from folders of their own -> that folder.
        self._own: dict[str, str] = {}
        #: Private queues taken without claim files (see take_in_batches).
        self._unclaimed: set[str] = set()
        #: Private queues close() could not delete (empty after a clean close).
        self.private_kept: set[str] = set()
        folders = [self.data_folder_in, self.data_folder_out, self._writing_folder,
                   self._claims_folder,
                   str(self.control_folder)]
        if self.store_processed:
            folders.append(self.processed_folder)
        for folder in folders:
            os.makedirs(folder, exist_ok=True)

    # The folders are worked out once per channel (its options do not
    # change): every message looks several of them up.
    @functools.cached_property
    def data_folder_in(self) -> str:
        """Folder messages are read from."""
        return _option_folder(self.transport_options, "data_folder_in", "messages")

    @functools.cached_property
    def data_folder_out(self) -> str:
        """Folder messages are written to."""
        return _option_folder(self.transport_options, "data_folder_out", "messages")

    @functools.cached_property
    def _writing_folder(self) -> str:
        """Where files are written before being renamed into data_folder_out."""
        return os.path.join(self.data_folder_out, _WRITING_FOLDER)

    @functools.cached_property
    def _claims_folder(self) -> str:
        """Where claimed files wait for their acknowledgement."""
        return os.path.join(self.data_folder_in, _CLAIMS_FOLDER)

    @functools.cached_property
    def processed_folder(self) -> str:
        """Folder processed messages are kept in (store_processed only)."""
        return _option_folder(self.transport_options, "processed_folder", "processed")

    @functools.cached_property
    def control_folder(self) -> Path:
        """Folder of the exchange -> queue tables (see _control_folder)."""
        return _control_folder(self.transport_options)

    # kombu's filesystem Channel names the argument ``payload`` where its base
    # class says ``message``; we keep kombu's filesystem signature.
    def _put(self, queue: Any, payload: Any,  # type: ignore[override]
             **kwargs: Any) -> None:
        """Write ``payload`` atomically under a name that sorts in write order."""
        data = str_to_bytes(dumps(payload))
        folder = self.data_folder_out
        # A private queue's own folder, if its owner made one (a shared queue,
        # or a private one whose name cannot name a folder, has none).
        own = _own_folder(folder, queue)
        if own is not None and os.path.isdir(own):
            folder = own
        tag = tags.next_tag()
        tmp = os.path.join(self._writing_folder, f"{_TMP_PREFIX}{tag}")
        try:
            _write_new_file(tmp, data)
            # Stamp and publish under one lock: this process's files become
            # visible in stamp order, so readers never see a later one first.
            with _SEQUENCE.lock:
                name = f"{_SEQUENCE.next():020d}_{tag}.{queue}{_MSG_SUFFIX}"
                try:
                    os.rename(tmp, os.path.join(folder, name))
                except FileNotFoundError:
                    if folder == self.data_folder_out or not os.path.exists(tmp):
                        raise
                    # The private queue was deleted (its folder with it) since
                    # its binding was looked up: like a message routed to no queue.
                    _remove_quietly(tmp)
                    LOG.info("Dropped a message for private queue %r: the queue was deleted",
                             queue)
        except OSError as e:
            _remove_quietly(tmp)
            if e.errno in _DISK_FULL_ERRNOS:
                # Recoverable, like a broker that is down: publishers retry
                # (for their publish timeout) and go through once space returns.
                raise exc.BrokerUnavailable(
                    f"No space left for message files in {folder!r} ({e.strerror}); nothing"
                    f" can be sent through this folder until space is freed", cause=e) from e
            raise ChannelError(f"Cannot add message file to {folder!r}: {e}") from e

    def folder_of(self, queue: str) -> str:
        """The folder ``queue``'s messages are read from: its own if it is ours and private."""
        own = self._own.get(queue)
        return own if own is not None else self.data_folder_in

    def _scan(self, queue: str) -> list[str]:
        """List the queue's message files in write order."""
        folder = self.folder_of(queue)
        try:
            names = os.listdir(folder)
        except OSError as e:
            raise ChannelError(f"Cannot list {folder!r}: {e}") from e
        now = time.monotonic()
        if now >= self._next_reclaim:
            self._next_reclaim = now + RECLAIM_PERIOD_S
            self._housekeep(names if folder == self.data_folder_in else None)
        return sorted(n for n in names if _queue_of(n) == queue)

    def _housekeep(self, listed: list[str] | None) -> None:
        """Put back dead processes' claims, adopt strays, delete dead processes' private queues.

        ``listed``: the message folder's names, when just listed.
        """
        self._reclaim(_list_claims(self._claims_folder))
        if self._own:
            if listed is None:
                try:
                    listed = os.listdir(self.data_folder_in)
                except OSError as e:
                    raise ChannelError(f"Cannot list {self.data_folder_in!r}: {e}") from e
            self._adopt_strays(listed)
        self._reap_private()

    def _adopt_strays(self, listed: list[str]) -> None:
        """Move our private queues' messages found in the message folder into their own folders.

        A publisher that knows no such folders (kombu's own filesystem
        transport, which a TaskFlow process uses) writes them there; the
        rename keeps their names, so they keep their place in write order.
        """
        for name in listed:
            own = self._own.get(_queue_of(name) or "")
            if own is None:
                continue
            try:
                os.rename(os.path.join(self.data_folder_in, name), os.path.join(own, name))
            except FileNotFoundError:
                continue
            except OSError as e:
                LOG.error("Could not move message %s into its private queue's folder: %s",
                          name, e)

    def _reclaim(self, claims: list[str]) -> None:
        """Put back in their queues the messages dead processes claimed (``.claims``)."""
        folder = self.data_folder_in
        for claim in claims:
            target = _dead_claim_target(claim)
            if target is None:
                continue
            try:
                os.rename(os.path.join(self._claims_folder, claim), os.path.join(folder, target))
            except FileNotFoundError:
                continue  # another consumer put it back first
            except OSError as e:
                LOG.error("Could not put back message %s claimed by a dead process: %s",
                          target, e)
                continue
            LOG.warning("Put back message %s: the process that took it died before"
                        " acknowledging it", target)

    def mark_private(self, queue: str) -> None:
        """``queue`` is this process's alone: delete it when the process closes or dies.

        Call before declaring (binding) the queue. Messages still in the
        queue then are dropped with it (logged).

        Raises:
            ChannelError: the marker file cannot be written.
        """
        if queue not in self._private:
            self._private[queue] = fp.mark(self.control_folder, queue, tags.process_tag())
            own = _own_folder(self.data_folder_in, queue)
            if own is not None:
                try:
                    os.makedirs(own, exist_ok=True)
                except OSError as e:
                    raise ChannelError(f"Cannot create folder {own!r}: {e}") from e
                self._own[queue] = own

    def _reap_private(self) -> None:
        """Delete the private queues of processes that are gone."""
        control = self.control_folder
        for marker in fp.markers(control):
            if marker.gone():
                _drop_private(control, self.data_folder_in, marker, clean=False)

    def close(self) -> None:
        """Close the channel, then delete the private queues it marked."""
        if self.closed or self.connection is None:
            self.private_kept.update(self._private)
            super().close()
            return
        private, self._private = self._private, {}
        self._own = {}
        control, messages, state = self.control_folder, self.data_folder_in, self.state
        # Unacknowledged messages go back first (kombu's close), then their
        # queue goes, so none is restored into a queue that no longer exists.
        super().close()
        for queue, path in private.items():
            state.queue_bindings_delete(queue)  # declaring it again binds it again
            marker = fp.Marker.parse(path.name)
            if marker is not None and fp.unmark(path):
                try:
                    _drop_private(control, messages, marker, clean=True)
                except Exception:
                    self.private_kept.add(queue)
                    LOG.exception("Could not delete private queue %r", queue)

    def _settle(self, message: Any) -> None:
        """Drop (or archive) the claimed file of an acknowledged or restored message."""
        claimed = message.properties.get(CLAIM_PROPERTY)
        if claimed:
            self._settle_path(claimed)

    def _settle_path(self, claimed: str) -> None:
        try:
            if self.store_processed:
                name = os.path.basename(claimed).split("@", 3)[-1]
                os.rename(claimed, os.path.join(self.processed_folder, name))
            else:
                os.unlink(claimed)
        except FileNotFoundError:
            pass
        except OSError as e:
            LOG.error("Could not remove claimed message file %s: %s", claimed, e)

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        message = self.qos._delivered.get(delivery_tag)
        super().basic_ack(delivery_tag, multiple=multiple)
        if message is not None:
            self._settle(message)

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        message = self.qos._delivered.get(delivery_tag)
        super().basic_reject(delivery_tag, requeue=requeue)
        if message is not None:
            self._settle(message)

    def _restore(self, message: Any) -> None:
        # A copy goes back in the queue first; only then is the claim dropped,
        # so the message exists on disk at every moment.
        super()._restore(message)
        self._settle(message)

    def _ready(self, queue: str) -> deque[str]:
        """Files of ``queue`` that can be delivered now without breaking write order.

        Listing a folder is not a snapshot: a file renamed into place while
        the listing runs may be missed while a later one is returned. So a
        file is delivered only once it was also present in the previous
        listing, or inotify told of its arrival before this listing began
        (then every file its writer wrote before it was in place too), and
        delivery stops at the first other file: any file written before a
        listed one is guaranteed to be in the next listing. With inotify a
        new message costs one listing, without it two.

        While the connection drains with inotify, a queue already listed
        since inotify last reported a file is not listed again (the
        connection's ``listed_queues``): a file landed since would have
        been reported, and one held back above was reported after that
        listing began. So a delivery is not followed by a listing that
        can only come back empty.
        """
        connection = self.connection
        landed: set[str] | frozenset[str] = getattr(connection, "landed_names", frozenset())
        listed: set[str] | None = getattr(connection, "listed_queues", None)
        if listed is not None and queue in listed:
            return deque()
        for _attempt in range(SCANS_PER_GET):
            names = self._scan(queue)
            seen = self._seen.get(queue, frozenset())
            ready: deque[str] = deque()
            for name in names:
                if name not in seen and name not in landed:
                    break
                ready.append(name)
            self._seen[queue] = frozenset(names)
            if ready or not names:
                break
        if listed is not None:
            listed.add(queue)
        return ready

    def take_in_batches(self, queue: str) -> None:
        """Take private ``queue``'s messages without a claim file (see _take_unclaimed).

        For a queue whose messages may be handled twice (replies): nothing
        is lost that a claim would keep, as the queue goes with its process.
        """
        self._unclaimed.add(queue)

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        """Claim (atomically) and return the oldest message of ``queue``."""
        pending = self._pending.get(queue)
        folder = self.folder_of(queue)
        unclaimed = queue in self._unclaimed
        while True:
            if not pending:
                pending = self._pending[queue] = self._ready(queue)
                if not pending:
                    raise Empty()
            name = pending.popleft()
            if unclaimed:
                payload = self._take_unclaimed(folder, name, queue)
                if payload is None:
                    continue
                return payload
            claimed = os.path.join(self._claims_folder, _claim_name(name))
            try:
                os.rename(os.path.join(folder, name), claimed)
            except FileNotFoundError:
                continue  # another consumer claimed it first
            except OSError as e:
                raise ChannelError(f"Cannot claim {name!r} in {folder!r}: {e}") from e
            try:
                raw = _read_file(claimed)
            except OSError as e:
                raise ChannelError(f"Cannot read message file {name!r}: {e}") from e
            try:
                payload = read_envelope(bytes_to_str(raw))
                # The claimed file stays until the message is acknowledged
                # (see basic_ack): a consumer killed before that loses nothing.
                payload.setdefault("properties", {})[CLAIM_PROPERTY] = claimed
                return payload
            except Exception as e:
                # A foreign or corrupt file must not stop the consumer.
                LOG.error("Dropped unreadable message file %s of queue %s: %s",
                          name, queue, e)
                self._settle_path(claimed)

    def _take_unclaimed(self, folder: str, name: str, queue: str) -> Any:
        """Read message file ``name`` and remove it; None if another reader took it.

        Removing the file is the claim (a file is never changed once in
        place, so reading it first is safe): of two readers, the one whose
        unlink fails drops what it read. A rename and, on acknowledgement,
        an unlink are saved per message.
        """
        path = os.path.join(folder, name)
        try:
            raw = _read_file(path)
            os.unlink(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ChannelError(f"Cannot take message file {name!r} from {folder!r}: {e}") from e
        try:
            return read_envelope(bytes_to_str(raw))
        except Exception as e:
            LOG.error("Dropped unreadable message file %s of queue %s: %s", name, queue, e)
            return None

    def _purge(self, queue: str) -> int:
        """Remove all messages of ``queue``; return how many."""
        self._pending.pop(queue, None)
        self._seen.pop(queue, None)
        own = self._own.get(queue)
        return int(super()._purge(queue)) + (_purge_files(own, queue) if own else 0)

    def _exchange_path(self, exchange: str) -> Path:
        """The file holding ``exchange``'s bindings; ChannelError for an unsafe name.

        The name becomes a file name in the control folder: only characters
        that cannot lead out of it are accepted (letters, digits, ``._-``, not
        all dots), whatever kombu version checks or not. Worked out once per
        exchange: every publish looks its table up.
        """
        file = self._exchange_paths.get(exchange)
        if file is not None:
            return file
        if exchange and (not _SAFE_EXCHANGE_NAME.fullmatch(exchange)
                         or not exchange.strip(".")):
            raise ChannelError(f"Invalid exchange name for the filesystem transport:"
                               f" {exchange!r} (letters, digits, '.', '_' and '-' only)")
        file = self.control_folder / f"{exchange}.exchange"
        if file.parent != self.control_folder:
            raise ChannelError(f"Invalid exchange name: {exchange!r}")
        self._exchange_paths[exchange] = file
        return file

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """Add a binding to the exchange table (create-or-update under one lock)."""
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self.control_folder.mkdir(parents=True, exist_ok=True)

        def add(table: list[Any]) -> bool:
            if entry in table:
                return False
            table.insert(0, entry)
            return True

        # Created if missing: two processes binding at once on a fresh folder
        # must not wipe each other's entries.
        self._update_table(exchange, add, create=True)

    def _delete(self, queue: str, exchange: str | None = None, routing_key: str = "",
                pattern: str = "", *args: Any, **kwargs: Any) -> None:
        """Delete ``queue``: its messages, and its binding in ``exchange``'s table.

        Done here rather than left to kombu: kombu's filesystem transport
        only empties the queue before 5.7, leaving a dead binding behind.
        """
        self._purge(queue)
        if exchange is None:
            return
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def remove(table: list[Any]) -> bool:
            if entry not in table:
                return False
            table.remove(entry)
            return True

        self._update_table(exchange, remove, create=False)

    def _update_table(self, exchange: str, change: Callable[[list[Any]], bool], *,
                      create: bool) -> None:
        """Apply ``change`` to ``exchange``'s binding table under the table file's lock.

        ``change`` edits the list in place and says whether it changed; the
        file is rewritten only then. A missing file is created when ``create``,
        else there is nothing to change.
        """
        file = self._exchange_path(exchange)
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

    def get_table(self, exchange: str) -> list[Any]:
        """The exchange's bindings, re-read only when the table file changed.

        Every publish looks the table up; a stat is much cheaper than
        open + lock + read + parse, and any binding change rewrites the file
        (new mtime/size). A table changed lately is read again, but parsed
        only if its bytes differ from the cached ones: every engine binds
        its reply queue when it starts, so with engines coming and going
        the table is nearly always recent.
        """
        file = self._exchange_path(exchange)
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


def _option_folder(options: Mapping[str, Any], key: str, sub: str) -> str:
    """An explicit folder option, else ``data_folder``/sub, else one shared default.

    kombu's defaults (``data_in`` and ``data_out`` in the current
    directory) are two different folders, so processes using them never
    hear each other; without any folder option every process of this
    user on this machine shares DEFAULT_DATA_FOLDER instead.
    """
    if options.get(key):
        return str(options[key])
    return os.path.join(str(options.get("data_folder") or DEFAULT_DATA_FOLDER), sub)


def _control_folder(options: Mapping[str, Any]) -> Path:
    """Folder of the exchange -> queue tables.

    Default: ``control`` beside (or inside) the message folders, at the
    path both sides share, instead of kombu's ``control`` relative to the
    current directory: processes started from different directories
    must see the same bindings, or messages are silently dropped.
    """
    if not options.get("control_folder") and not options.get("data_folder"):
        common = os.path.commonpath(
            [os.path.abspath(_option_folder(options, "data_folder_in", "messages")),
             os.path.abspath(_option_folder(options, "data_folder_out", "messages"))])
        return Path(common) / "control"
    return Path(_option_folder(options, "control_folder", "control"))


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


_BROKER_STATES = _BrokerStates()


# Plain descriptors instead of open(): without the io layers a message file
# costs ~15 us less to write and to read, and each task writes three.
def _write_new_file(path: str, data: bytes) -> None:
    """Create ``path`` (it must not exist) holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _read_file(path: str) -> bytes:
    """All of ``path``'s bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, _READ_CHUNK_BYTES):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _drop_private(control: Path, messages: str, marker: fp.Marker, *, clean: bool) -> None:
    """Delete ``marker``'s queue: bindings first (no new messages), then messages."""
    with fp.removing(control, marker) as ours:
        if not ours:
            return
        bindings = fp.unbind(control, marker)
        if bindings is None:
            LOG.info("Private queue %r of process %d, which died, is kept: another"
                     " live process declared it", marker.queue, marker.pid)
            return
        dropped = _purge_files(messages, marker.queue) + _drop_own_folder(messages,
                                                                           marker.queue)
    if not clean:
        LOG.warning("Deleted private queue %r (%d binding(s)) of process %d, which died;"
                    " dropped %d message(s) left in it", marker.queue, bindings,
                    marker.pid, dropped)
    elif dropped:
        # Its owner closed it and will read nothing more: what is left is for
        # nobody (typically workers' announcements), not a loss to warn about.
        LOG.info("Deleted private queue %r as this process closed it; dropped %d"
                 " message(s) left in it", marker.queue, dropped)
    else:
        LOG.debug("Deleted private queue %r as this process closed it", marker.queue)


def _drop_own_folder(messages: str, queue: str) -> int:
    """Remove a private queue's own folder and the messages in it; how many there were."""
    own = _own_folder(messages, queue)
    if own is None or not os.path.isdir(own):
        return 0
    count = _purge_files(own, queue)
    try:
        os.rmdir(own)
    except FileNotFoundError:
        pass
    except OSError as e:
        # A publisher that looked the binding up before it went may still
        # write into it: what is there now is dropped the next time.
        LOG.debug("Could not remove folder %s of private queue %r yet: %s", own, queue, e)
    return count


def _own_folder(messages: str, queue: str) -> str | None:
    """The folder of private queue ``queue`` in message folder ``messages``; None if unnameable."""
    if not _SAFE_QUEUE_FOLDER.fullmatch(queue):
        return None
    return os.path.join(messages, _OWN_FOLDERS, queue)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _purge_files(folder: str, queue: str) -> int:
    """Remove ``queue``'s message files, and dead processes' claims of them."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise ChannelError(f"Cannot list {folder!r}: {e}") from e
    claims_folder = os.path.join(folder, _CLAIMS_FOLDER)
    files = itertools.chain(((folder, name) for name in names),
                            ((claims_folder, name) for name in _list_claims(claims_folder)))
    count = 0
    for where, name in files:
        if where == claims_folder:
            target = _dead_claim_target(name)
            if target is None or _queue_of(target) != queue:
                continue
        elif _queue_of(name) != queue:
            continue
        try:
            os.unlink(os.path.join(where, name))
        except FileNotFoundError:
            continue  # taken or removed meanwhile
        except OSError as e:
            LOG.error("Could not remove message file %s of private queue %r: %s",
                      name, queue, e)
            continue
        count += 1
    return count


def _list_claims(claims_folder: str) -> list[str]:
    """The claims in ``claims_folder`` (none if it is missing)."""
    try:
        return [name for name in os.listdir(claims_folder) if name.startswith(_CLAIM_PREFIX)]
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ChannelError(f"Cannot list {claims_folder!r}: {e}") from e


def _message_of(queues: set[str]) -> Callable[[str], bool]:
    """Whether a file name is that of a message of one of ``queues``."""
    return lambda name: _queue_of(name) in queues


class Transport(filesystem.Transport):
    """File-system transport: ordered atomic files, inotify wake-ups."""

    Channel = Channel
    polling_interval = inotify.FALLBACK_POLL_S
    driver_name = "flowengine-filesystem"
    #: See contract.py: a queue marked private goes with its process.
    flowengine_implements = contract.Capabilities(private_queues=True, batch_take=True)

    _watcher: inotify.FolderWatcher | None = None
    #: Message files inotify reported before the current listing (see Channel._ready).
    landed_names: set[str] | frozenset[str] = frozenset()
    #: While draining with inotify: queues listed since inotify last reported
    #: a wanted file or the watcher last woke (see Channel._ready); else None.
    listed_queues: set[str] | None = None

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.state = _BROKER_STATES.of(_control_folder(client.transport_options or {}))
        # Kept across drain_events calls: what the last rounds listed, and for which queues.
        self._listed: set[str] = set()
        self._queues_listed: set[str] = set()

    def drain_events(self, connection: Any, timeout: float | None = None,
                     **kwargs: Any) -> None:
        """Deliver one message, sleeping on inotify up to ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        assert self.cycle is not None  # kombu sets it up with the transport
        get = self.cycle.get
        watcher = self._watcher
        if watcher is None:  # only consumers need one (publishers never drain)
            watcher = self._watcher = inotify.FolderWatcher()
        landed: set[str] = set()
        listed = self._listed
        while True:
            queues = self._consumed_queues()
            if queues != self._queues_listed:
                # Files of a queue consumed anew were passed over unreported.
                listed.clear()
                self._queues_listed = queues
            wanted = _message_of(queues)
            for channel in self.channels:
                for queue in channel._active_queues:
                    watcher.watch(channel.folder_of(queue))
            # Read what landed before looking: those files are in place.
            if watcher.landed(wanted, landed):
                listed.clear()
            self.landed_names = landed
            self.listed_queues = listed if watcher.active else None
            try:
                get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            finally:
                self.landed_names = frozenset()
                self.listed_queues = None
            landed = set()
            wait = inotify.IDLE_RECHECK_S if watcher.active else (
                self.polling_interval or inotify.FALLBACK_POLL_S)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                wait = min(wait, remaining)
            watcher.wait_for(wanted, wait, landed)
            # Woken by a report or by the idle re-check: look again either way.
            listed.clear()

    def _consumed_queues(self) -> set[str]:
        """The queues this connection's channels consume."""
        return {queue for channel in self.channels for queue in channel._active_queues}

    def close_connection(self, connection: Any) -> None:
        """Close channels and the inotify descriptor."""
        try:
            super().close_connection(connection)
        finally:
            if self._watcher is not None:
                self._watcher.close()
                self._watcher = None
