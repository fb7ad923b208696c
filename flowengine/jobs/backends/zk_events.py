"""Board events of the ZooKeeper jobboard, from watches (no polling).

Two children watches feed :class:`ZkEvents`: one on the listed jobs (a
child appears: POSTED; one disappears: DONE) and one on the leases (one
disappears: RELEASED, whether given back or expired with its claimer's
session; one appears: CLAIMED, a hint for the other claimers). ZooKeeper
fires a watch once and kazoo re-arms it with a fresh listing, so changes
between two listings are compared as sets; a change that added and removed
the same job in between is still a change, and wakes waiters as a RESYNC.
A reconnection after a suspended or lost session also delivers RESYNC:
what happened meanwhile must be re-read.

Callbacks run on this module's own thread, never on kazoo's (which must
not block: it also delivers the replies other calls wait for).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from flowengine.utils import optional

try:
    from kazoo.client import KazooClient
    from kazoo.protocol.states import KazooState
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

from flowengine.jobs.store import BoardEvent, EventKind

__all__ = ["ZkEvents"]

LOG = logging.getLogger(__name__)

#: How long close() waits for the delivery thread to finish the event in hand.
STOP_TIMEOUT_S = 10.0


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


class ZkEvents:
    """Watches ``listed_path`` and ``leases_path`` and delivers board events to callbacks."""

    def __init__(self, client: KazooClient, listed_path: str, leases_path: str, name: str) -> None:
        self._client = client
        self._callbacks: list[Callable[[BoardEvent], None]] = []
        self._queue: queue.Queue[BoardEvent | None] = queue.Queue()
        self._watches = [
            _SetWatch(EventKind.POSTED, EventKind.DONE, self._queue.put),
            _SetWatch(EventKind.CLAIMED, EventKind.RELEASED, self._queue.put),
        ]
        self._paths = (listed_path, leases_path)
        self._name = name
        self._interrupted = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Arm the watches (they hold their first listing when this returns)."""
        self._thread = threading.Thread(
            target=self._deliver, daemon=True, name=f"flowengine-board-events-{self._name}"
        )
        self._thread.start()
        self._client.add_listener(self._on_state)
        for path, watch in zip(self._paths, self._watches):
            self._client.ChildrenWatch(path, watch)

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
            LOG.info("Board %s: ZooKeeper connection back", self._name)
            self._queue.put(BoardEvent(EventKind.RESYNC))

    def _deliver(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            for callback in list(self._callbacks):
                try:
                    callback(event)
                except Exception:
                    LOG.exception("A board event handler failed on %s", event)
