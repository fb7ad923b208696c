"""One thread per board renewing every lease it holds, in one batch per period.

A conductor runs many jobs; renewing each from its own thread would cost a
thread and a round trip per job. The keeper renews them all with one call
to the store every ``lease_s / RENEWALS_PER_LEASE`` seconds. When the store
answers that a lease is gone (the claim was superseded while this process
was paused or cut off), the keeper drops it and calls ``on_lost`` at once,
so the conductor can suspend that job's engine. If the server cannot be
reached the keeper keeps trying: it does not guess, because the fencing
token, not this process's belief, decides who may still write.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from flowengine import exceptions as exc

__all__ = ["LeaseKeeper"]

LOG = logging.getLogger(__name__)

#: Renewal failures in a row that are logged at WARNING (later ones at
#: DEBUG until one succeeds): an outage is one line, not a flood.
_WARN_FAILURES = 1


class LeaseKeeper:
    """Renews held ``(uuid, token)`` leases; reports the lost ones.

    ``renew(held, lease_s) -> lost uuids`` is the store's batch renewal;
    ``on_lost(uuid, token)`` runs on the keeper thread.
    """

    def __init__(
        self,
        renew: Callable[[Sequence[tuple[str, int]], float], set[str]],
        lease_s: float,
        period_s: float,
        on_lost: Callable[[str, int], None],
        name: str = "board",
    ) -> None:
        self._renew = renew
        self._lease_s = lease_s
        self._period_s = period_s
        self._on_lost = on_lost
        self._name = name
        self._held: dict[str, int] = {}
        #: Held leases whose job is being finished (consumed, given back...).
        self._settling: set[str] = set()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._failures = 0

    def hold(self, uuid: str, token: int) -> None:
        """Keep renewing the claim ``token`` on job ``uuid`` until released."""
        with self._cond:
            self._held[uuid] = token
            self._stopped = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name=f"flowengine-lease-keeper-{self._name}"
                )
                self._thread.start()
            self._cond.notify_all()

    def release(self, uuid: str, token: int | None = None) -> None:
        """Stop renewing ``uuid`` (only if held under ``token``, when given)."""
        with self._cond:
            if token is None or self._held.get(uuid) == token:
                self._held.pop(uuid, None)

    @contextlib.contextmanager
    def settling(self, uuid: str) -> Iterator[None]:
        """While job ``uuid`` is being finished, a renewal finding its lease gone is no loss.

        A renewal sent before the finish may reach the server after it, and
        find the lease the finish removed: the finish's own answer says
        whether the claim was still ours (ClaimLost if not), so the keeper
        reports nothing meanwhile. The caller releases the lease when the
        finish took effect; otherwise it stays held and later renewals report.
        """
        with self._cond:
            self._settling.add(uuid)
        try:
            yield
        finally:
            with self._cond:
                self._settling.discard(uuid)

    def held(self) -> dict[str, int]:
        """A copy of what is held: uuid -> token."""
        with self._cond:
            return dict(self._held)

    def stop(self) -> None:
        """Stop renewing (held leases then run out on the server) and end the thread."""
        with self._cond:
            self._stopped = True
            self._held.clear()
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        next_at = time.monotonic() + self._period_s
        while True:
            with self._cond:
                # Idle (nothing held): sleep until something is; otherwise
                # until the next renewal is due.
                while not self._stopped and (not self._held or time.monotonic() < next_at):
                    if not self._held:
                        self._cond.wait()
                        next_at = time.monotonic() + self._period_s
                    else:
                        self._cond.wait(max(0.0, next_at - time.monotonic()))
                if self._stopped:
                    return
                batch = dict(self._held)
            next_at = time.monotonic() + self._period_s
            self._renew_batch(batch)

    def _renew_batch(self, batch: dict[str, int]) -> None:
        try:
            lost = self._renew(sorted(batch.items()), self._lease_s)
        except exc.JobFailure as e:
            self._failures += 1
            level = logging.WARNING if self._failures <= _WARN_FAILURES else logging.DEBUG
            LOG.log(
                level,
                "Could not renew %d job lease(s) on board %s (%s); retrying every"
                " %.1f s. The jobs stay ours unless another conductor claims them after"
                " their lease (%.1f s) ran out",
                len(batch),
                self._name,
                e,
                self._period_s,
                self._lease_s,
            )
            return
        if self._failures:
            LOG.info("Renewing job leases on board %s works again", self._name)
            self._failures = 0
        for uuid in lost:
            with self._cond:
                token = batch[uuid]
                if self._held.get(uuid) != token or uuid in self._settling:
                    continue  # released meanwhile, or being finished: not ours to report
                del self._held[uuid]
            try:
                self._on_lost(uuid, token)
            except Exception:  # a bad handler must not stop renewals of the rest
                LOG.exception("Lease-lost handler failed for job %s", uuid)
