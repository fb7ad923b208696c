"""Helpers for event-stream tests: a collecting receiver and the sequence checker."""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from flowengine.engines.worker_based import events as ev

#: Bounded wait (s), only so that a bug fails a test instead of hanging it.
WAIT_S = 20.0


class Collector:
    """Collects events; tests wait on a condition until what they expect arrived."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def __call__(self, event: dict[str, Any]) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = WAIT_S
    ) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.events), timeout)

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e["type"] in types]


@contextlib.contextmanager
def collecting(exchange: str, **conn: Any) -> Iterator[Collector]:
    """An EventReceiver feeding a Collector for the duration of the block."""
    collector = Collector()
    receiver = ev.EventReceiver(exchange, collector, **conn)
    thread = threading.Thread(target=receiver.run, daemon=True)
    thread.start()
    assert receiver.wait_ready(WAIT_S), "event receiver did not start"
    try:
        yield collector
    finally:
        receiver.stop()
        thread.join(WAIT_S)


def flow_finished(count: int = 1) -> Callable[[list[dict[str, Any]]], bool]:
    """Predicate: ``count`` flow-finished events arrived."""
    return lambda events: sum(e["type"] == "flow-finished" for e in events) >= count


def flow_and_requests_finished(
    requests: int, flows: int = 1
) -> Callable[[list[dict[str, Any]]], bool]:
    """Predicate: ``flows`` flow-finished events and ``requests`` requests' ends arrived.

    For checking every request's sequence: a worker sends a request's
    terminal event after its outcome reply, from a publisher of its own, so
    the engine's flow-finished may arrive before the last request's end.
    """
    finished = flow_finished(flows)

    def ended(events: list[dict[str, Any]]) -> bool:
        return (
            finished(events)
            and sum(e["type"] in ev.TERMINAL_TASK_EVENTS and "action" in e for e in events)
            >= requests
        )

    return ended


def brief(events: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """(type, action, uuid prefix) of each task event: a failure message that fits."""
    return [
        (e["type"], e.get("action", ""), str(e.get("uuid", ""))[:8])
        for e in events
        if e["type"] in ev.TASK_EVENTS
    ]


class RequestCount:
    """How each request ended on the stream: done once, duplicated, or lost."""

    def __init__(self) -> None:
        self.done_once: list[tuple[str, str]] = []
        self.duplicated: list[tuple[str, str]] = []
        self.lost: list[tuple[str, str]] = []
        self.runs: dict[tuple[str, str], list[list[str]]] = {}


def check_sequences(events: list[dict[str, Any]]) -> RequestCount:
    """Check ordering and completeness; return per-request counts.

    Per sender, clocks strictly increase in arrival order. Per request
    (uuid, action), events sorted by clock form runs (a retried atom is
    requested again with the same uuid), each ``task-received`` ->
    ``task-started`` -> ``task-progress``* -> exactly one terminal event.
    """
    last_clock: dict[str, int] = {}
    for event in events:
        for field in ev.STANDARD_FIELDS:
            assert field in event, (field, event)
        sender = event["hostname"]
        assert event["clock"] > last_clock.get(sender, 0), (
            f"clock of {sender} went backwards: {event}"
        )
        last_clock[sender] = event["clock"]
    by_request: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["type"] in ev.TASK_EVENTS and "action" in event:
            by_request[(event["uuid"], event["action"])].append(event)
    count = RequestCount()
    for key, seq in by_request.items():
        seq.sort(key=lambda e: (e["hostname"], e["clock"]))
        runs: list[list[str]] = []
        for event in seq:
            if event["type"] == "task-received" or not runs:
                runs.append([])
            runs[-1].append(event["type"])
        count.runs[key] = runs
        for run in runs:
            terminals = [t for t in run if t in ev.TERMINAL_TASK_EVENTS]
            if not terminals:
                count.lost.append(key)
                continue
            if len(terminals) > 1:
                count.duplicated.append(key)
                continue
            if run == ["task-expired"]:  # dropped unrun on arrival
                count.done_once.append(key)
                continue
            assert run[0] == "task-received", run
            assert run[-1] == terminals[0], run
            assert run[1] == "task-started", run
            assert all(t == "task-progress" for t in run[2:-1]), run
            count.done_once.append(key)
    return count
