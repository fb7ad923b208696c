"""What the ZooKeeper board last saw of each listed job, so a write need not read first.

A claim or a finish is one ``multi`` guarded by the job znode's version
(and the lease znode's). If the version this store last read or wrote is
still the job's, the data it saw is still the job's data: the ``multi`` can
be built from it and sent at once, saving the read round trip that would
otherwise come first. If the job changed meanwhile the version check fails,
nothing is written, and the caller reads afresh and tries again, exactly as
after a lost race. A remembered state is only ever used to *attempt* a
guarded write: every refusal (held, backing off, superseded, not the owner)
is decided on a fresh read.

What is remembered: every listed job from the latest listing (with its
lease, if owned), each claim this store made (the job's new stat and the
lease it created), and each renewal of those leases. A job that leaves the
board is forgotten; a listing drops the jobs it no longer shows.
"""

from __future__ import annotations

import threading
from typing import Any

from flowengine.utils import optional

try:
    from kazoo.protocol.states import ZnodeStat
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

__all__ = ["KnownJobs", "Read", "Seen", "created_stat"]

#: A znode read: its JSON object and stat, or None when it does not exist.
Read = tuple[dict[str, Any], ZnodeStat] | None
#: A listed job and its lease, as last seen.
Seen = tuple[Read, Read]


def created_stat(sibling: ZnodeStat, data_length: int, owner_session: int) -> ZnodeStat:
    """The stat of a znode created in the same ``multi`` that wrote ``sibling``.

    Every operation of one transaction shares its zxid and server time, so
    the new znode's creation and modification are the sibling's modification.
    """
    return ZnodeStat(
        czxid=sibling.mzxid,
        mzxid=sibling.mzxid,
        ctime=sibling.mtime,
        mtime=sibling.mtime,
        version=0,
        cversion=0,
        aversion=0,
        ephemeralOwner=owner_session,
        dataLength=data_length,
        numChildren=0,
        pzxid=sibling.mzxid,
    )


def _newer(a: Read, b: Read) -> Read:
    """Of two reads of one znode, the later one (zxids only grow)."""
    if a is None or b is None:
        return b if a is None else a
    return a if a[1].mzxid >= b[1].mzxid else b


class KnownJobs:
    """Thread-safe memory of the latest state seen of each listed job (see the module doc)."""

    def __init__(self) -> None:
        self._seen: dict[str, Seen] = {}
        self._lock = threading.Lock()

    def recall(self, uuid: str) -> Seen | None:
        """The job and lease as last seen, or None if not remembered."""
        with self._lock:
            return self._seen.get(uuid)

    def remember(self, uuid: str, job: Read, lease: Read) -> None:
        """Note what a write of ours just made the job and its lease."""
        with self._lock:
            self._seen[uuid] = (job, lease)

    def forget(self, uuid: str) -> None:
        """The job left the board, or what we know of it may be wrong: read it next time."""
        with self._lock:
            self._seen.pop(uuid, None)

    def listed(self, seen: dict[str, Seen]) -> None:
        """A listing's reads replace what is known; a write newer than the listing is kept."""
        with self._lock:
            old = self._seen
            for uuid, (job, lease) in seen.items():
                before = old.get(uuid)
                if before is None or job is None or before[0] is None:
                    continue
                if before[0][1].mzxid > job[1].mzxid:
                    seen[uuid] = before  # claimed (by us) after the listing read it
                elif before[0][1].mzxid == job[1].mzxid:
                    seen[uuid] = (job, _newer(before[1], lease))
            self._seen = seen

    def renewed(self, uuid: str, token: int, lease: Read) -> None:
        """The claim ``token``'s lease was rewritten (a renewal): keep its new version."""
        with self._lock:
            before = self._seen.get(uuid)
            if before is not None and before[0] is not None and before[0][1].mzxid == token:
                self._seen[uuid] = (before[0], _newer(before[1], lease))
