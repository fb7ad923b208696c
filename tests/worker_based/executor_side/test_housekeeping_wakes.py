"""The housekeeper is woken only by deadlines earlier than its next look.

A chain of tasks empties the request book between two tasks. A scan made
then found no deadline, so every next request (its transition deadline)
and its PENDING (its loss bound) woke the housekeeper again, which scanned
once more, usually after that request had finished: a thread wake-up and a
scan per task for nothing. The housekeeper now tells the book when it looks
again anyway; only a deadline before that wakes it.
"""

from __future__ import annotations

import threading
import time
import types
import uuid
from typing import Any

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.housekeeper import (
    HOUSEKEEPING_MAX_SLEEP_S,
    Housekeeper,
)
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.engines.worker_based.executor_side.remote_stats import RemoteStatistics
from tests import waiting
from tests.worker_based import executor_tasks as et

#: A transition timeout far beyond the housekeeper's longest sleep.
TIMEOUT_S = 60.0

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 10.0
#: The engine every request of these tests belongs to.
_OWNER = tr.Owner(RemoteStatistics())


class _OneTopicFinder:
    """Routes every task to topic 't'; has no workers to clean or announce to."""

    topics = ["t"]

    def get_route_for_task(self, task: Any) -> tuple[Any, str]:
        return types.SimpleNamespace(topic="t"), "t"

    def clean(self) -> int:
        return 0

    def maybe_publish(self) -> None:
        pass

    def seconds_to_next_beat(self) -> float | None:
        return None


def _request() -> tr.Tracked:
    request = pr.Request(
        et.Echo("e"), uuid.uuid4().hex, pr.EXECUTE, {"value": 1}, timeout=TIMEOUT_S
    )
    return tr.Tracked(request, None, request.created_on + TIMEOUT_S, _OWNER)


def test_a_deadline_after_the_scanners_next_look_does_not_wake_it():
    # Given an empty book whose scanner looks again in 5 s anyway
    book = tr.RequestBook(_OneTopicFinder(), TIMEOUT_S)
    now = time.monotonic()
    book.scanner_wakes_at(now + 5.0)
    # When a request with a 60 s transition deadline comes, then is heard of
    tracked = _request()
    route, wake = book.submit(tracked)
    assert route is not None
    # Then neither its deadline nor its 6 s loss bound wakes the scanner
    assert not wake
    with book.lock:
        assert not book.heard(tracked, "w1", 6.0)
    # But a deadline before the next look does
    with book.lock:
        assert book.heard(tracked, "w1", 1.0)


def test_without_a_planned_look_the_first_deadline_wakes_the_scanner():
    book = tr.RequestBook(_OneTopicFinder(), TIMEOUT_S)
    _, wake = book.submit(_request())
    assert wake


def test_after_a_round_over_an_empty_book_the_housekeeper_has_a_next_look():
    # Given a housekeeper over an empty book, running
    book = tr.RequestBook(_OneTopicFinder(), TIMEOUT_S)
    watch = types.SimpleNamespace(check=lambda waiting, now: None)
    keeper = Housekeeper(
        "executor",
        book,
        _OneTopicFinder(),  # type: ignore[arg-type]
        RequestPolicy(transition_timeout=TIMEOUT_S),
        requests=None,  # type: ignore[arg-type]
        unserved_watch=watch,
    )  # type: ignore[arg-type]
    keeper.arm()
    started = time.monotonic()
    thread = threading.Thread(target=keeper.run, daemon=True)
    thread.start()
    try:
        # When it has gone round once
        waiting.wait_until(
            lambda: book.next_deadline is not None,
            "the housekeeper's first round",
            timeout=WAIT_S,
            poll_s=0.01,
        )
        # Then the book knows when it looks again (its longest sleep at most)
        assert book.next_deadline <= time.monotonic() + HOUSEKEEPING_MAX_SLEEP_S
        assert book.next_deadline >= started
        # And a new request (60 s deadline) does not wake it
        _, wake = book.submit(_request())
        assert not wake
    finally:
        keeper.stop()
        thread.join(WAIT_S)
    assert not thread.is_alive()
