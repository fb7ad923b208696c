"""Board events of the ZooKeeper jobboard, from watches (no polling).

Two children watches feed :class:`ZkEvents`: one on the listed jobs (a
child appears: POSTED; one disappears: DONE) and one on the leases (one
disappears: RELEASED, whether given back or expired with its claimer's
session; one appears: CLAIMED, a hint for the other claimers). ZooKeeper
fires a watch once and this module re-arms it with a fresh listing, so
changes between two listings are compared as sets; a change that added and
removed the same job in between is still a change, and wakes waiters as a
RESYNC. A reconnection after a suspended or lost session also delivers
RESYNC: what happened meanwhile must be re-read.

The watches are this module's, not kazoo's ``ChildrenWatch``: kazoo
re-sends no watch to the server it reconnects to, and its ``ChildrenWatch``
re-lists after a reconnection only if it noticed the suspension; a listing
whose answer came in just before the connection dropped (a node killed
mid-run) leaves it believing its watch armed, and it never fires again.
Here every reconnection re-lists every watched folder, unconditionally.

Listings and callbacks run on this module's own thread, never on kazoo's
(which must not block: it also delivers the replies other calls wait for).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from flowengine.utils import optional

try:
    from kazoo import exceptions as k_exc
    from kazoo.client import KazooClient
    from kazoo.protocol.states import EventType, KazooState, WatchedEvent
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

from flowengine.jobs.store import BoardEvent, EventKind
from flowengine.utils import kazoo_utils

__all__ = ["ZkEvents"]

LOG = logging.getLogger(__name__)

#: How long close() waits for the delivery thread to finish the event in hand.
STOP_TIMEOUT_S = 10.0
#: Bound on one listing's round trip; one not answered by then is made
#: again (kazoo's calls wait without a bound, see kazoo_utils.answer_within).
LIST_TIMEOUT_S = 10.0


class _SetWatch:
    """Turns successive listings of one znode's children into added/removed events."""

    def __init__(
        self, added: EventKind | None, removed: EventKind, emit: Callable[[BoardEvent], None]
    ) -> None:
        self._added, self._removed, self._emit = added, removed, emit
        self.known: set[str] | None = None  # the latest listing (replaced, never mutated)
        self.stopped = False

    def __call__(self, children: list[str]) -> bool:
        if self.stopped:
            return False  # tells kazoo to drop this watch
        now = set(children)
        known, self.known = self.known, now
        if known is None:
            return True  # the first listing: the baseline, nothing happened yet
        changed = False
        if self._added is not None:
            for uuid in sorted(now - known):
                self._emit(BoardEvent(self._added, uuid))
                changed = True
        for uuid in sorted(known - now):
            self._emit(BoardEvent(self._removed, uuid))
            changed = True
        if not changed:  # something came and went between two listings
            self._emit(BoardEvent(EventKind.RESYNC))
        return True


class _Listing:
    """One watched folder: its path, what to tell of each listing, whether one is due."""

    def __init__(self, path: str, on_children: Callable[[list[str]], bool]) -> None:
        self.path = path
        #: Called with each listing; False ends the watch (as kazoo's ChildrenWatch).
        self.on_children = on_children
        self.due = False  # a listing is queued and not yet started
        self.stopped = False
        #: The watch function given to kazoo: always the same one, so kazoo
        #: keeps one registration per folder however often it is re-armed.
        self.watcher: Callable[[Any], None] | None = None


class ZkEvents:
    """Watches ``listed_path`` and ``leases_path`` and delivers board events to callbacks."""

    def __init__(self, client: KazooClient, listed_path: str, leases_path: str, name: str) -> None:
        self._client = client
        self._callbacks: list[Callable[[BoardEvent], None]] = []
        # The delivery thread's work, in order: events, listings to make, None to stop.
        self._queue: queue.Queue[BoardEvent | _Listing | None] = queue.Queue()
        self._watches = [
            _SetWatch(EventKind.POSTED, EventKind.DONE, self._queue.put),
            _SetWatch(EventKind.CLAIMED, EventKind.RELEASED, self._queue.put),
        ]
        self._paths = (listed_path, leases_path)
        self._name = name
        self._interrupted = False
        self._listings: list[_Listing] = []
        self._due_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _watched(self) -> list[tuple[str, Callable[[list[str]], bool]]]:
        """The folders to watch, each with what its listings feed."""
        return [(path, watch) for path, watch in zip(self._paths, self._watches)]

    def start(self) -> None:
        """Arm the watches (they hold their first listing when this returns).

        Raises kazoo's error if a first listing fails (the connection is down).
        """
        self._listings = [_Listing(path, feed) for path, feed in self._watched()]
        self._client.add_listener(self._on_state)
        # The first listings are made here, before the thread runs (it must
        # not list the same folder at once), so that the caller sees a failure;
        # whatever fires meanwhile is queued for the thread.
        made = 0
        try:
            for listing in self._listings:
                self._list(listing, first=True)
                made += 1
        finally:
            for listing in self._listings[made:]:
                self._request(listing)  # failed: the thread tries again
            self._thread = threading.Thread(
                target=self._deliver, daemon=True, name=f"flowengine-board-events-{self._name}"
            )
            self._thread.start()

    def leased(self) -> frozenset[str] | None:
        """The uuids with a lease znode at the leases watch's latest listing (None: none yet).

        Fresh to within one watch round trip: a claim made by another board
        shows here about when its ``multi`` is answered.
        """
        known = self._watches[1].known
        return None if known is None else frozenset(known)

    def add(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver events to ``callback`` too."""
        self._callbacks.append(callback)

    def stop(self) -> None:
        """Drop the watches and end the delivery thread."""
        for watch in self._watches:
            watch.stopped = True
        for listing in self._listings:
            listing.stopped = True
        self._client.remove_listener(self._on_state)
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT_S)
        self._thread = None

    def _on_state(self, state: Any) -> None:
        # kazoo's connection thread: only note it, never block here.
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            if not self._interrupted:
                LOG.warning(
                    "Board %s: ZooKeeper connection %s; events resume on reconnection",
                    self._name,
                    str(state).lower(),
                )
            self._interrupted = True
        elif state == KazooState.CONNECTED and self._interrupted:
            self._interrupted = False
            LOG.info("Board %s: ZooKeeper connection back; watches re-armed", self._name)
            self._queue.put(BoardEvent(EventKind.RESYNC))
            # The server we are back on knows none of our watches, whatever
            # a listing in flight at the drop seemed to say: list them all again.
            for listing in self._listings:
                self._request(listing)

    def _request(self, listing: _Listing) -> None:
        """Queue a listing of ``listing`` unless one is queued already."""
        with self._due_lock:
            if listing.due or listing.stopped:
                return
            listing.due = True
        self._queue.put(listing)

    def _fired(self, listing: _Listing) -> Callable[[WatchedEvent], None]:
        def fired(event: WatchedEvent) -> None:
            # kazoo's callback thread. A NONE event is kazoo dropping its
            # watches at a suspension: the reconnection lists again.
            if event.type != EventType.NONE:
                self._request(listing)

        return fired

    def _list(self, listing: _Listing, first: bool = False) -> None:
        """List the folder, arming its watch, and feed the listing (delivery thread)."""
        with self._due_lock:
            listing.due = False  # a watch firing from now on asks for another
        if listing.stopped:
            return
        if listing.watcher is None:
            listing.watcher = self._fired(listing)
        pending = self._client.get_children_async(listing.path, watch=listing.watcher)
        try:
            children = kazoo_utils.answer_within(self._client, pending, LIST_TIMEOUT_S)
        except k_exc.NoNodeError:
            # As kazoo's ChildrenWatch: a folder deleted under the board ends its watch.
            LOG.warning("Board %s: %s was deleted; its watch ends", self._name, listing.path)
            listing.stopped = True
            return
        except k_exc.OperationTimeoutError:
            if first:
                raise
            self._request(listing)  # no answer yet: ask again (paced by the bound)
            return
        except (k_exc.ConnectionLoss, k_exc.SessionExpiredError):
            if first:
                raise
            return  # the reconnection asks for every listing again
        except k_exc.ZookeeperStoppedError:
            return  # the client is being stopped: the board is closing
        if listing.on_children(children) is False:
            listing.stopped = True

    def _deliver(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _Listing):
                try:
                    self._list(item)
                except Exception:
                    LOG.exception("Board %s: listing %s failed", self._name, item.path)
                continue
            for callback in list(self._callbacks):
                try:
                    callback(item)
                except Exception:
                    LOG.exception("A board event handler failed on %s", item)
