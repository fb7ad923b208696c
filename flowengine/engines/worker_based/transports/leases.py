"""Keeps a consumer's lease on a leasing transport alive, from a thread of its own.

flowengine's Redis transport holds each message a consumer took in an
in-flight list of that consumer; the list goes back to its queue once the
consumer's lease lapses (transports/redis_consumers.py). A LeaseKeeper renews
the lease every third of its length, so only a dead (or frozen) process
loses its holdings; a worker's keeper also puts back what dead consumers
held, and retires its consumer (holdings back, private queues deleted) when
the proxy stops consuming.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from flowengine.engines.worker_based.transports import redis_consumers as rc

LOG = logging.getLogger(__name__)

#: Renewals per lease period: two may be lost or late before the lease lapses.
RENEWALS_PER_LEASE = 3

#: Shortest pause (s) between two renewals, whatever the lease.
MIN_RENEW_PERIOD_S = 0.05

#: Bound (s) on one connection attempt of the keeper: a stop must not wait
#: out an unreachable broker.
CONNECT_TIMEOUT_S = 2.0

#: Bound (s) on waiting for the keeper thread to end when stopping.
STOP_JOIN_S = 5.0


class LeaseKeeper:
    """Renews ``consumer_id``'s lease of ``lease_s`` seconds on ``conn``'s broker.

    With ``reclaim``, each renewal also puts back the holdings of consumers
    whose lease lapsed (workers do; executors only keep their own lease).
    """

    def __init__(self, conn: Any, consumer_id: str, lease_s: float, reclaim: bool) -> None:
        # Cloned here, in the owner's thread: cloning sets up the template's
        # transport, which kombu does lazily and without a lock.
        self._template = conn.clone(connect_timeout=CONNECT_TIMEOUT_S)
        self._consumer_id = consumer_id
        self._lease_ms = max(1, int(lease_s * 1000))
        self._reclaim = reclaim
        self._period_s = max(MIN_RENEW_PERIOD_S, lease_s / RENEWALS_PER_LEASE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._failing = False
        self._renewed = False
        self._retired = False
        self._lapsed = threading.Event()
        #: Messages of dead consumers this keeper put back so far.
        self.reclaimed_count = 0

    @property
    def consumer_id(self) -> str:
        """The consumer whose lease is kept."""
        return self._consumer_id

    @property
    def retired(self) -> bool:
        """True once stop() retired the consumer: its private queues are deleted."""
        return self._retired

    def start(self) -> None:
        """Renew now and then every period, until stop()."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, daemon=True, name=f"flowengine-lease-{self._consumer_id}"
        )
        self._thread.start()

    def stop(self, retire: bool = True) -> None:
        """Stop renewing; with ``retire``, give back holdings and drop private queues now."""
        self._stop.set()
        if self._thread is not None:
            # A keeper that never renewed holds nothing: leave it to finish its
            # connection attempt (it is a daemon) rather than wait it out.
            self._thread.join(STOP_JOIN_S if self._renewed else 0)
            self._thread = None
        if retire and self._renewed:  # never renewed: nothing held, nothing to give back
            try:
                back = rc.retire(self._client(), self._consumer_id)
                self._retired = True
                if back:
                    LOG.info(
                        "Consumer %s put back %d unsettled message(s) on leaving",
                        self._consumer_id,
                        back,
                    )
            except Exception as e:
                LOG.warning(
                    "Consumer %s could not retire its lease (%s); its holdings go"
                    " back when the lease lapses",
                    self._consumer_id,
                    e,
                )
        self._close()

    def lapsed(self) -> bool:
        """True (once) when the lease was found to have lapsed while we lived.

        The others then took back what this consumer held and deleted its
        private queues: its owner must declare and consume them again.
        """
        if self._lapsed.is_set():
            self._lapsed.clear()
            return True
        return False

    def renew_once(self) -> int:
        """Renew (and reclaim) now; how many messages of dead consumers went back."""
        back, fresh = rc.renew(self._client(), self._consumer_id, self._lease_ms, self._reclaim)
        if fresh and self._renewed:
            LOG.error(
                "The lease of consumer %s lapsed (the process was frozen or cut off"
                " for longer than %.2f s): other consumers took back what it held;"
                " its queues are declared again",
                self._consumer_id,
                self._lease_ms / 1000,
            )
            self._lapsed.set()
        self._renewed = True
        if back:
            self.reclaimed_count += back
            LOG.warning(
                "Put back %d message(s) held by consumers whose lease lapsed (dead"
                " or frozen processes)",
                back,
            )
        return back

    def _loop(self) -> None:
        while True:
            try:
                self.renew_once()
                if self._failing:
                    self._failing = False
                    LOG.info("Lease of consumer %s renewed again", self._consumer_id)
            except Exception as e:
                self._close()
                if not self._failing:
                    self._failing = True
                    # Before a first renewal the owner's consume loop reports
                    # the broker problem itself (once, precisely).
                    LOG.log(
                        logging.WARNING if self._renewed else logging.DEBUG,
                        "Could not renew the lease of consumer %s (%s); retrying every %.2f s",
                        self._consumer_id,
                        e,
                        self._period_s,
                    )
            if self._stop.wait(self._period_s):
                return

    def _client(self) -> Any:
        """A Redis client on a connection of the keeper's own."""
        if self._conn is None:
            conn = self._template.clone()
            try:
                conn.connect()
                client = conn.default_channel.client
            except Exception:
                conn.release()
                raise
            self._conn = conn
            return client
        return self._conn.default_channel.client

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.release()
            except Exception:
                LOG.debug("Error closing the lease connection", exc_info=True)
