"""The receiver's lower bound on a sender's clock (wire/peer_clock.py) and the process clock."""

from __future__ import annotations

import pathlib
import re

import pytest

from flowengine.engines.worker_based.wire import clock, peer_clock


def test_bound_is_the_best_sample_plus_time_since():
    # Given messages sent at 1000.0 and 1003.0 (sender's clock), received at
    # monotonic 10.0 and 14.0 (the second one spent a second longer in transit)
    pc = peer_clock.PeerClock()
    pc.observe(1000.0, 10.0)
    pc.observe(1003.0, 14.0)
    # Then at monotonic 20.0 the sender's clock reads at least 1010.0 (from
    # the faster first message), never more
    assert pc.now(20.0) == pytest.approx(1010.0)


def test_old_samples_leave_the_window_but_the_newest_stays():
    pc = peer_clock.PeerClock()
    pc.observe(1000.0, 10.0)  # fast transit, soon too old to count
    pc.observe(1000.0, 12.0)  # two seconds slower
    later = 12.0 + peer_clock.WINDOW_S
    assert pc.now(later) == pytest.approx(1000.0 + peer_clock.WINDOW_S)
    pc2 = peer_clock.PeerClock()
    pc2.observe(5.0, 1.0)
    assert pc2.now(1.0 + 10 * peer_clock.WINDOW_S) == pytest.approx(5.0 + 10 * peer_clock.WINDOW_S)


def test_overdue_uses_the_senders_clock_not_ours():
    # Given our clock two minutes ahead of the sender's
    previous = clock.install(clock.OffsetClock(120.0))
    try:
        clocks = peer_clock.PeerClocks()
        sent = clock.wall() - 120.0  # the sender's clock now
        clocks.observe("engine", sent)
        # Then a deadline 30 s ahead on the sender's clock is not past
        assert clocks.overdue("engine", sent + 30.0) is None
        # ...and one 30 s behind it is, by about 30 s
        assert clocks.overdue("engine", sent - 30.0) == pytest.approx(30.0, abs=1.0)
        # A sender never heard from: our own clock is all there is
        assert clocks.overdue("stranger", clock.wall() - 1.0) is not None
    finally:
        clock.install(previous)


def test_no_wall_clock_read_bypasses_the_process_clock():
    # Every wall-clock reading of worker_based goes through wire/clock.py, so
    # a test (or a badly set host) moving that clock moves all of them.
    package = pathlib.Path(clock.__file__).parent.parent
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "clock.py"
        and re.search(r"\btime\.time\(\)|datetime\.now\(", path.read_text())
    ]
    assert offenders == []
