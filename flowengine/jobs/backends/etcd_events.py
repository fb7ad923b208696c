"""Board events of the etcd jobboard, from one etcd watch on the board's prefix (no polling).

The watch is a long-lived streaming request to the gateway's ``/v3/watch``
held by an :class:`~flowengine.jobs.backends.event_thread.EventThread`, which
re-opens it after a broken connection and then delivers RESYNC (what changed
meanwhile must be re-read). Keys map to events: a job key created under
``listed/`` is POSTED, one deleted there is DONE (consumed, trashed,
dead-lettered); a key deleted under ``locks/`` is RELEASED, whether its
claimer gave it back or its etcd lease expired.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

from flowengine.jobs.backends import etcd_client, event_thread
from flowengine.jobs.store import BoardEvent, EventKind

try:
    import requests
except ImportError as e:  # pragma: no cover - requests comes with etcd3gw
    from flowengine.utils import optional

    raise optional.missing_extra("etcd", e) from e

__all__ = ["EtcdEvents", "WatchEnded"]


class WatchEnded(Exception):
    """The watch stream ended or was cancelled by the server: open a new one."""


class EtcdEvents:
    """Watches every key under ``root`` and turns the changes into board events."""

    def __init__(self, gateway: etcd_client.EtcdGateway, root: str, name: str) -> None:
        self._gateway = gateway
        self._root = root.rstrip("/") + "/"
        self._thread = event_thread.EventThread(
            name,
            self._open,
            self._receive,
            self._shut,
            self._decode,
            (requests.exceptions.RequestException, WatchEnded, OSError, ValueError),
        )

    def start(self) -> bool:
        """Open the watch; True once etcd confirmed it."""
        return self._thread.start()

    def add(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver events to ``callback`` too."""
        self._thread.add(callback)

    def stop(self) -> None:
        """Cancel the watch and end its thread."""
        self._thread.stop()

    def _open(self) -> tuple[Any, Any]:
        client = self._gateway.client
        create = etcd_client.EtcdGateway.get(self._root, prefix=True)["request_range"]
        # No read timeout: the stream is idle while the board is; stop() shuts
        # its socket to end a blocked read.
        response = client.session.post(
            client.get_url("/watch"),
            json={"create_request": create},
            stream=True,
            timeout=(client.timeout, None),
        )
        if response.status_code != 200:
            response.close()
            raise WatchEnded(f"etcd refused the watch: HTTP {response.status_code}")
        lines = response.iter_lines()
        first = self._next(lines)
        if not first.get("created"):
            response.close()
            raise WatchEnded(f"etcd did not create the watch: {first}")
        return response, lines

    @staticmethod
    def _next(lines: Any) -> dict[str, Any]:
        for line in lines:
            if line.strip():
                result = json.loads(line).get("result") or {}
                if result.get("canceled") or result.get("compact_revision"):
                    raise WatchEnded(f"etcd cancelled the watch: {result}")
                return dict(result)
        raise WatchEnded("the watch stream ended")

    def _receive(self, handle: tuple[Any, Any]) -> list[dict[str, Any]]:
        return list(self._next(handle[1]).get("events") or [])

    @staticmethod
    def _shut(handle: tuple[Any, Any]) -> None:
        response = handle[0]
        try:
            # Shutting the socket down (not just closing our handle of it)
            # wakes the thread blocked reading it.
            dup = socket.fromfd(response.raw.fileno(), socket.AF_INET, socket.SOCK_STREAM)
            try:
                dup.shutdown(socket.SHUT_RDWR)
            finally:
                dup.close()
        except (OSError, ValueError, AttributeError):
            pass  # already closed
        response.close()

    def _decode(self, event: dict[str, Any]) -> BoardEvent | None:
        kv = etcd_client.Kv.from_wire(event.get("kv") or {})
        if not kv.key.startswith(self._root):
            return None
        folder, _, uuid = kv.key[len(self._root) :].partition("/")
        deleted = event.get("type") == "DELETE"
        if folder == "listed":
            if deleted:
                return BoardEvent(EventKind.DONE, uuid)
            if kv.create_revision == kv.mod_revision:  # created, not updated
                return BoardEvent(EventKind.POSTED, uuid)
        elif folder == "locks" and deleted:
            return BoardEvent(EventKind.RELEASED, uuid)
        return None
