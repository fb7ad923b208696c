"""A receiver's estimate of each sender's clock, from the send times its messages carry.

A request's ``expires`` is a time on its engine's clock. Comparing it with
the worker's own clock would make clock skew decide: a worker two minutes
fast drops every request, one two minutes slow runs work its engine gave up
on. Instead a worker reads the engine's clock off the engine's own
messages: each request and each NOTIFY carries the engine's wall-clock time
at publication (header ``enqueued``). When a message sent at ``t`` (engine
clock) arrives at monotonic instant ``m`` (worker), the engine's clock read
at least ``t`` at ``m``, so at any later instant ``n`` it reads at least
``t + (n - m)``. The estimate is the best such lower bound over the messages
of the last :data:`WINDOW_S`:

* it is never ahead of the engine's clock (short of the two clocks' rates
  differing by more than a few hundred ppm over the window), so a worker
  never drops a request before its engine's ``expires`` -- whatever the
  skew between the two hosts' wall clocks, which are never compared;
* it lags the engine's clock by the shortest transit time among those
  messages (a NOTIFY goes out every few seconds and crosses an idle broker
  in milliseconds), so a request is dropped at most that late after its
  ``expires``, which the engine's expiry margin (1 s) absorbs.

A sender whose messages carry no send time (a TaskFlow process)
leaves only the receiver's own clock: then ``expires`` is compared with it,
and skew must stay within the expiry margin.
"""

from __future__ import annotations

import collections
import threading

from flowengine.engines.worker_based.wire import clock

__all__ = ["MAX_PEERS", "WINDOW_S", "PeerClock", "PeerClocks"]

#: Seconds a message's send time keeps counting toward its sender's clock:
#: long enough that a worker busy for a while still has a recent sample (an
#: engine sends NOTIFY every 5 s), short enough that the drift between the
#: two clocks' rates (well under 0.1 % with NTP) stays in milliseconds, and
#: that a sender's clock stepped back by an operator is followed within it.
WINDOW_S = 60.0

#: Senders (engines) whose clocks are followed at once; the least recently
#: heard is forgotten first.
MAX_PEERS = 1024


class PeerClock:
    """The lower bound on one sender's clock (not thread-safe: PeerClocks locks)."""

    def __init__(self) -> None:
        # (received at, monotonic; sent at minus received at): a sliding-window
        # maximum of the second, kept with the newest sample always last and
        # the offsets decreasing from first to last.
        self._samples: collections.deque[tuple[float, float]] = collections.deque()

    def observe(self, sent_at: float, received_at: float) -> None:
        """A message sent at ``sent_at`` (its clock) arrived at ``received_at`` (monotonic)."""
        offset = sent_at - received_at
        while self._samples and self._samples[-1][1] <= offset:
            self._samples.pop()  # older and no higher: never the best again
        self._samples.append((received_at, offset))

    def now(self, at: float) -> float | None:
        """The sender's clock at monotonic ``at``, at least (None: never heard)."""
        while len(self._samples) > 1 and self._samples[0][0] < at - WINDOW_S:
            self._samples.popleft()
        if not self._samples:
            return None
        return at + self._samples[0][1]


class PeerClocks:
    """The clocks of every sender heard from, by reply address; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._peers: collections.OrderedDict[str, PeerClock] = collections.OrderedDict()

    def observe(self, peer: str, sent_at: float | None) -> None:
        """A message of ``peer`` sent at ``sent_at`` (its clock; None: not said) arrived now."""
        if sent_at is None:
            return
        received_at = clock.monotonic()
        with self._lock:
            peer_clock = self._peers.get(peer)
            if peer_clock is None:
                peer_clock = self._peers[peer] = PeerClock()
                while len(self._peers) > MAX_PEERS:
                    self._peers.popitem(last=False)
            else:
                self._peers.move_to_end(peer)
            peer_clock.observe(sent_at, received_at)

    def now(self, peer: str) -> float:
        """``peer``'s clock now: the lower bound, or this host's clock if never heard."""
        at = clock.monotonic()
        with self._lock:
            peer_clock = self._peers.get(peer)
            estimate = None if peer_clock is None else peer_clock.now(at)
        return clock.wall() if estimate is None else estimate

    def overdue(self, peer: str, deadline: float) -> float | None:
        """Seconds ``deadline`` (``peer``'s clock) is past by now, or None if not yet."""
        late = self.now(peer) - deadline
        return late if late > 0 else None
