"""Connecting to one of the nodes of a broker cluster: kombu's failover URL lists.

A broker URL may list several servers, ``amqp://h1//;amqp://h2//;amqp://h3//``
(kombu's syntax; each must be a node of the same cluster, or a server that
holds the same queues). kombu connects to the first and, inside its own
retry loop, switches to the next on a failure. flowengine's consume loops
and publishers do not retry inside kombu (they pause between attempts
themselves, so that a stop is prompt), and a clone of a connection starts
again at the first URL: a consumer whose node died would try that dead node
for ever. :class:`Failover` makes one *attempt* a pass over the list: from
the URL that answered last (``failover_strategy='round-robin'``, kombu's
default) or in a random order (``'shuffle'``), each once, without pausing,
until one accepts. A dead node on loopback or on a LAN refuses at once (or
within the connect timeout when it is black-holed), so the consumers are
consuming again on a surviving node within one attempt.

Each URL keeps flowengine's transport (kombu's own switching re-reads the
scheme and would fall back to kombu's transport).
"""

from __future__ import annotations

import random
import threading
from typing import Any

from kombu.connection import Connection
from kombu.exceptions import OperationalError

__all__ = ["FAILOVER_STRATEGIES", "Failover", "connect_any"]

#: The orders in which a pass tries the URLs (kombu's strategy names).
ROUND_ROBIN = "round-robin"
SHUFFLE = "shuffle"
FAILOVER_STRATEGIES = (ROUND_ROBIN, SHUFFLE)


def connect_any(template: Connection) -> Connection:
    """A connected clone of ``template`` at the first of its URLs that accepts.

    For one-off connections (a command's, an event stream's): each URL once,
    in order, without pausing, each through flowengine's transport. Raises
    the last URL's error (as kombu's OperationalError where kombu wraps it).
    """
    return Failover(template).connect()


class Failover:
    """The URLs of one template connection, and which of them answered last.

    One per owner of a connection (a consume loop, a publisher); thread-safe.
    """

    def __init__(self, template: Connection) -> None:
        self.template = template
        self._urls: list[str | None] = list(template.alt or ()) or [None]
        self._shuffle = getattr(template, "_failover_strategy", ROUND_ROBIN) == SHUFFLE
        self._lock = threading.Lock()
        self._current = 0

    @property
    def size(self) -> int:
        """How many URLs a pass tries."""
        return len(self._urls)

    def _order(self) -> list[int]:
        with self._lock:
            start = self._current
        if self._shuffle:
            others = [i for i in range(len(self._urls)) if i != start]
            random.shuffle(others)
            return [start, *others]
        return [(start + i) % len(self._urls) for i in range(len(self._urls))]

    def clone(self, index: int, **kwargs: Any) -> Connection:
        """A new, unconnected connection to URL ``index`` (``kwargs`` as kombu's clone())."""
        url = self._urls[index]
        conn: Connection = (
            self.template.clone(**kwargs)
            if url is None
            else self.template.clone(hostname=url, **kwargs)
        )
        return conn

    def connect(self, *, library_errors: bool = True, **kwargs: Any) -> Connection:
        """A connected clone: the URL that answered last first, then each other once.

        ``kwargs`` go to kombu's clone() (``connect_timeout``...). Errors a
        new connection cannot cure (a refused login) are raised at once;
        when every URL failed, the last URL's error is raised (as kombu's
        OperationalError when ``library_errors``, as it came otherwise).
        """
        last: BaseException | None = None
        for index in self._order():
            conn = self.clone(index, **kwargs)
            try:
                conn.ensure_connection(max_retries=0, reraise_as_library_errors=library_errors)
            except BaseException as e:
                _release(conn)
                if not _worth_next_url(e, conn):
                    raise
                last = e
                continue
            with self._lock:
                self._current = index
            return conn
        assert last is not None
        raise last


def _worth_next_url(error: BaseException, conn: Connection) -> bool:
    """True for errors another node may not have (down, unreachable, reset)."""
    return isinstance(error, (OSError, OperationalError, *conn.recoverable_connection_errors))


def _release(conn: Connection) -> None:
    try:
        conn.release()
    except Exception:  # a connection that never opened has nothing to close
        pass
