"""What the filesystem transport's consumers clean up for processes that are gone.

There is no server to notice a dead process, so every consumer of a folder
looks now and then (filesystem.RECLAIM_PERIOD_S) and:

* puts back in their queues the messages a dead process had claimed and not
  acknowledged (``reclaim``), so none is lost;
* moves into a private queue's own folder the messages written for it into
  the message folder by a publisher that knows no such folders
  (``adopt_strays``);
* deletes the private queues of dead processes, bindings then messages
  (``reap_private``; a process closing its channel does it for its own with
  ``drop_private``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flowengine.engines.worker_based.transports import filesystem_layout as layout
from flowengine.engines.worker_based.transports import filesystem_private as fp

LOG = logging.getLogger(__name__)


def reclaim(messages: str, claims_folder: str) -> None:
    """Put back in ``messages`` the messages dead processes claimed into ``claims_folder``."""
    for claim in layout.list_claims(claims_folder):
        target = layout.dead_claim_target(claim)
        if target is None:
            continue
        try:
            os.rename(os.path.join(claims_folder, claim), os.path.join(messages, target))
        except FileNotFoundError:
            continue  # another consumer put it back first
        except OSError as e:
            LOG.error("Could not put back message %s claimed by a dead process: %s", target, e)
            continue
        LOG.warning(
            "Put back message %s: the process that took it died before acknowledging it", target
        )


def adopt_strays(messages: str, listed: list[str], own: dict[str, str]) -> None:
    """Move our private queues' messages found in the message folder into their own folders.

    ``listed``: the names in ``messages``; ``own``: private queue -> its
    folder. A publisher that knows no such folders (kombu's own filesystem
    transport, which a TaskFlow process uses) writes them there; the rename
    keeps their names, so they keep their place in write order.
    """
    for name in listed:
        folder = own.get(layout.queue_of(name) or "")
        if folder is None:
            continue
        try:
            os.rename(os.path.join(messages, name), os.path.join(folder, name))
        except FileNotFoundError:
            continue
        except OSError as e:
            LOG.error("Could not move message %s into its private queue's folder: %s", name, e)


def reap_private(control: Path, messages: str) -> None:
    """Delete the private queues of processes that are gone."""
    for marker in fp.markers(control):
        if marker.gone():
            drop_private(control, messages, marker, clean=False)


def drop_private(control: Path, messages: str, marker: fp.Marker, *, clean: bool) -> None:
    """Delete ``marker``'s queue: bindings first (no new messages), then messages.

    ``clean``: its owner closed it (else the owner died, which is warned about).
    """
    with fp.removing(control, marker) as ours:
        if not ours:
            return
        bindings = fp.unbind(control, marker)
        if bindings is None:
            LOG.info(
                "Private queue %r of process %d, which died, is kept: another"
                " live process declared it",
                marker.queue,
                marker.pid,
            )
            return
        dropped = layout.purge_files(messages, marker.queue) + _drop_own_folder(
            messages, marker.queue
        )
    if not clean:
        LOG.warning(
            "Deleted private queue %r (%d binding(s)) of process %d, which died;"
            " dropped %d message(s) left in it",
            marker.queue,
            bindings,
            marker.pid,
            dropped,
        )
    elif dropped:
        # Its owner closed it and will read nothing more: what is left is for
        # nobody (typically workers' announcements), not a loss to warn about.
        LOG.info(
            "Deleted private queue %r as this process closed it; dropped %d message(s) left in it",
            marker.queue,
            dropped,
        )
    else:
        LOG.debug("Deleted private queue %r as this process closed it", marker.queue)


def _drop_own_folder(messages: str, queue: str) -> int:
    """Remove a private queue's own folder and the messages in it; how many there were."""
    own = layout.own_folder(messages, queue)
    if own is None or not os.path.isdir(own):
        return 0
    count = layout.purge_files(own, queue)
    try:
        os.rmdir(own)
    except FileNotFoundError:
        pass
    except OSError as e:
        # A publisher that looked the binding up before it went may still
        # write into it: what is there now is dropped the next time.
        LOG.debug("Could not remove folder %s of private queue %r yet: %s", own, queue, e)
    return count
