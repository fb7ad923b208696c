"""Jobboards for the tests: one kind each, every board object of a test sharing its data.

``Boards(kind, url)``: ``make(**options)`` returns a new, connected board
object on the same data (a second "process"); ``url`` is what a conductor
process is given. Each test gets its own namespace, so tests on a shared
server never see each other's jobs.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib import parse

from flowengine.jobs import backends

#: Every board kind the behaviour suite runs on.
BOARD_KINDS = ("memory", "redis", "sqlite", "postgresql", "zookeeper", "etcd")
#: Kinds several processes can share (the fault tests run on these).
SHARED_KINDS = ("redis", "sqlite", "postgresql", "zookeeper", "etcd")
#: The shortest lease a server grants: etcd grants whole seconds, and at
#: least its minimum TTL (2 s for a one-member etcd with default timings).
LEASE_UNIT_S = {"etcd": 2.0}


class Boards:
    """Board objects of one kind over one test's data."""

    def __init__(self, kind: str, base_url: str) -> None:
        self.kind = kind
        self.base_url = base_url
        self.namespace = f"t{uuid.uuid4().hex[:12]}"
        sep = "&" if "?" in base_url else "?"
        self.url = f"{base_url}{sep}namespace={self.namespace}"
        self._made: list[Any] = []

    def fresh(self) -> Boards:
        """Boards of the same kind and server on another, new namespace."""
        return Boards(self.kind, self.base_url)

    def url_with(self, **options: Any) -> str:
        """The board URL with extra options in its query."""
        return self.url + "".join(f"&{k}={parse.quote(str(v))}" for k, v in options.items())

    def make(
        self, name: str = "board", persistence: Any = None, connect: bool = True, **options: Any
    ) -> Any:
        """A new board object on this test's data (connected unless told otherwise)."""
        board = backends.fetch(name, {"board": self.url, **options}, persistence=persistence)
        if connect:
            board.connect()
        self._made.append(board)
        return board

    def close(self) -> None:
        """Close every board made."""
        for board in self._made:
            board.close()
