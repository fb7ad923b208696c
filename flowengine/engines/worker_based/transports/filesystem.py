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

This module holds the channel (writing, listing in order, claiming,
settling) and the transport (sleeping on inotify). The rest is in modules of
their own: file names, folders and file I/O in filesystem_layout.py, the
binding tables in filesystem_bindings.py, what consumers clean up after dead
processes in filesystem_housekeeping.py, private queues' markers in
filesystem_private.py.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
from collections import deque
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps

from flowengine import exceptions as exc
from flowengine.engines.worker_based.transports import contract, inotify, tags
from flowengine.engines.worker_based.transports import filesystem_bindings as bindings
from flowengine.engines.worker_based.transports import filesystem_housekeeping as housekeeping
from flowengine.engines.worker_based.transports import filesystem_layout as layout
from flowengine.engines.worker_based.transports import filesystem_private as fp
from flowengine.engines.worker_based.transports.envelope import read_envelope

LOG = logging.getLogger(__name__)

#: Listings one _get may make before giving up for this round: a new file
#: needs two (see Channel._ready), a third covers one missed by the first.
SCANS_PER_GET = 3

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
        self._next_reclaim = 0.0
        #: Queues this channel marked private -> their marker file.
        self._private: dict[str, Path] = {}
        #: Private queues this channel reads from folders of their own -> that folder.
        self._own: dict[str, str] = {}
        #: Private queues taken without claim files (see take_in_batches).
        self._unclaimed: set[str] = set()
        #: Private queues close() could not delete (empty after a clean close).
        self.private_kept: set[str] = set()
        folders = [
            self.data_folder_in,
            self.data_folder_out,
            self._writing_folder,
            self._claims_folder,
            str(self.control_folder),
        ]
        if self.store_processed:
            folders.append(self.processed_folder)
        for folder in folders:
            os.makedirs(folder, exist_ok=True)

    # The folders are worked out once per channel (its options do not
    # change): every message looks several of them up.
    @functools.cached_property
    def data_folder_in(self) -> str:
        """Folder messages are read from."""
        return layout.option_folder(self.transport_options, "data_folder_in", "messages")

    @functools.cached_property
    def data_folder_out(self) -> str:
        """Folder messages are written to."""
        return layout.option_folder(self.transport_options, "data_folder_out", "messages")

    @functools.cached_property
    def _writing_folder(self) -> str:
        """Where files are written before being renamed into data_folder_out."""
        return os.path.join(self.data_folder_out, layout.WRITING_FOLDER)

    @functools.cached_property
    def _claims_folder(self) -> str:
        """Where claimed files wait for their acknowledgement."""
        return os.path.join(self.data_folder_in, layout.CLAIMS_FOLDER)

    @functools.cached_property
    def processed_folder(self) -> str:
        """Folder processed messages are kept in (store_processed only)."""
        return layout.option_folder(self.transport_options, "processed_folder", "processed")

    @functools.cached_property
    def control_folder(self) -> Path:
        """Folder of the exchange -> queue tables (see layout.control_folder)."""
        return layout.control_folder(self.transport_options)

    # kombu's filesystem Channel names the argument ``payload`` where its base
    # class says ``message``; we keep kombu's filesystem signature.
    def _put(  # type: ignore[override]
        self,
        queue: Any,
        payload: Any,
        **kwargs: Any,
    ) -> None:
        """Write ``payload`` atomically under a name that sorts in write order."""
        data = str_to_bytes(dumps(payload))
        folder = self.data_folder_out
        # A private queue's own folder, if its owner made one (a shared queue,
        # or a private one whose name cannot name a folder, has none).
        own = layout.own_folder(folder, queue)
        if own is not None and os.path.isdir(own):
            folder = own
        tag = tags.next_tag()
        tmp = os.path.join(self._writing_folder, f"{layout.TMP_PREFIX}{tag}")
        try:
            layout.write_new_file(tmp, data)
            # Stamp and publish under one lock: this process's files become
            # visible in stamp order, so readers never see a later one first.
            with layout.SEQUENCE.lock:
                name = f"{layout.SEQUENCE.next():020d}_{tag}.{queue}{layout.MSG_SUFFIX}"
                try:
                    os.rename(tmp, os.path.join(folder, name))
                except FileNotFoundError:
                    if folder == self.data_folder_out or not os.path.exists(tmp):
                        raise
                    # The private queue was deleted (its folder with it) since
                    # its binding was looked up: like a message routed to no queue.
                    layout.remove_quietly(tmp)
                    LOG.info("Dropped a message for private queue %r: the queue was deleted", queue)
        except OSError as e:
            layout.remove_quietly(tmp)
            if e.errno in _DISK_FULL_ERRNOS:
                # Recoverable, like a broker that is down: publishers retry
                # (for their publish timeout) and go through once space returns.
                raise exc.BrokerUnavailable(
                    f"No space left for message files in {folder!r} ({e.strerror}); nothing"
                    f" can be sent through this folder until space is freed",
                    cause=e,
                ) from e
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
        return sorted(n for n in names if layout.queue_of(n) == queue)

    def _housekeep(self, listed: list[str] | None) -> None:
        """Put back dead processes' claims, adopt strays, delete dead processes' private queues.

        ``listed``: the message folder's names, when just listed.
        """
        housekeeping.reclaim(self.data_folder_in, self._claims_folder)
        if self._own:
            if listed is None:
                try:
                    listed = os.listdir(self.data_folder_in)
                except OSError as e:
                    raise ChannelError(f"Cannot list {self.data_folder_in!r}: {e}") from e
            housekeeping.adopt_strays(self.data_folder_in, listed, self._own)
        housekeeping.reap_private(self.control_folder, self.data_folder_in)

    def mark_private(self, queue: str) -> None:
        """``queue`` is this process's alone: delete it when the process closes or dies.

        Call before declaring (binding) the queue. Messages still in the
        queue then are dropped with it (logged).

        Raises:
            ChannelError: the marker file cannot be written.
        """
        if queue not in self._private:
            self._private[queue] = fp.mark(self.control_folder, queue, tags.process_tag())
            own = layout.own_folder(self.data_folder_in, queue)
            if own is not None:
                try:
                    os.makedirs(own, exist_ok=True)
                except OSError as e:
                    raise ChannelError(f"Cannot create folder {own!r}: {e}") from e
                self._own[queue] = own

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
                    housekeeping.drop_private(control, messages, marker, clean=True)
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
            claimed = os.path.join(self._claims_folder, layout.claim_name(name))
            try:
                os.rename(os.path.join(folder, name), claimed)
            except FileNotFoundError:
                continue  # another consumer claimed it first
            except OSError as e:
                raise ChannelError(f"Cannot claim {name!r} in {folder!r}: {e}") from e
            try:
                raw = layout.read_file(claimed)
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
                LOG.error("Dropped unreadable message file %s of queue %s: %s", name, queue, e)
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
            raw = layout.read_file(path)
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
        return int(super()._purge(queue)) + (layout.purge_files(own, queue) if own else 0)

    @functools.cached_property
    def _bindings(self) -> bindings.BindingTables:
        """This channel's view of the control folder's binding tables."""
        return bindings.BindingTables(self.control_folder)

    def get_table(self, exchange: str) -> list[Any]:
        """The exchange's bindings (kombu routes a message with them)."""
        return self._bindings.get(exchange)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """Add a binding to the exchange table (create-or-update under one lock)."""
        self._bindings.bind(exchange, routing_key, pattern, queue)

    def _delete(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        pattern: str = "",
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Delete ``queue``: its messages, and its binding in ``exchange``'s table.

        Done here rather than left to kombu: kombu's filesystem transport
        only empties the queue before 5.7, leaving a dead binding behind.
        """
        self._purge(queue)
        if exchange is not None:
            self._bindings.unbind(exchange, routing_key, pattern, queue)


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
        options = client.transport_options or {}
        self.state = bindings.BROKER_STATES.of(layout.control_folder(options))
        # Kept across drain_events calls: what the last rounds listed, and for which queues.
        self._listed: set[str] = set()
        self._queues_listed: set[str] = set()

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
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
            wanted = layout.message_of(queues)
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
            wait = (
                inotify.IDLE_RECHECK_S
                if watcher.active
                else (self.polling_interval or inotify.FALLBACK_POLL_S)
            )
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
