"""What the dashboard shows of the live fleet: workers, requests, throughput over time.

A :class:`LiveState` thread asks every worker for its ``stats`` (which carry
its identity and the requests it holds) every POLL_PERIOD_S; throughput is
the difference of the workers' counters between two rounds divided by the
time that really passed between them (rounds are late by the answers' wait
and come early when an event asks for one). Events (from workers started
with ``--events``) are kept as a recent list; a task or worker event asks
for a round at once, and is published *with* that round's answers, so one
snapshot never shows an event next to older worker figures. Readers wait for
a change with :meth:`LiveState.wait_change` (the server-sent events stream
does).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from flowengine.engines.worker_based.events import EventReceiver
from flowengine.engines.worker_based.messaging.control_client import ControlClient
from flowengine.engines.worker_based.messaging.settings import BrokerSettings

LOG = logging.getLogger(__name__)

#: Seconds between two rounds of questions to the workers: live enough to
#: watch, one broadcast per round whatever the fleet's size.
POLL_PERIOD_S = 2.0

#: Seconds a round waits for answers (a live worker answers in milliseconds).
ANSWER_TIMEOUT_S = 0.5

#: Points of throughput history kept (at POLL_PERIOD_S each: ten minutes).
HISTORY_POINTS = 300

#: Events kept for the page (the most recent).
RECENT_EVENTS = 50


class LiveState:
    """The fleet as last seen, with its history; thread-safe, versioned."""

    def __init__(
        self,
        exchange: str,
        broker: BrokerSettings,
        events: bool = True,
        poll_period_s: float = POLL_PERIOD_S,
    ) -> None:
        self.exchange = exchange
        self._broker = broker
        self._events = events
        self._period = poll_period_s
        self._cond = threading.Condition()
        self._version = 0
        self._workers: list[dict[str, Any]] = []
        self._last_totals: dict[str, tuple[int, int]] = {}
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=HISTORY_POINTS)
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_EVENTS)
        #: Task and worker events not yet shown: each waits for the first round
        #: asked after it arrived, and is published with that round's answers.
        self._pending: list[dict[str, Any]] = []
        self._error: str | None = None
        self._last_round_at: float | None = None
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._client: ControlClient | None = None
        self._receiver: EventReceiver | None = None
        self._threads: list[threading.Thread] = []

    # --- life cycle ---

    def start(self) -> None:
        """Connect (raises the broker problem at once) and start asking."""
        self._client = ControlClient(self.exchange, self._broker)
        self._client.start()
        self._spawn(self._poll_loop, "poll")
        if self._events:
            self._receiver = EventReceiver(self.exchange, self._on_event, broker=self._broker)
            self._spawn(self._receiver.run, "events")

    def stop(self) -> None:
        """Stop asking and listening."""
        self._stop.set()
        self._poke.set()
        if self._receiver is not None:
            self._receiver.stop()
        for thread in self._threads:
            thread.join(5.0)
        if self._client is not None:
            self._client.stop()
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=f"flowengine-dashboard-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    # --- reading ---

    @property
    def broker(self) -> BrokerSettings:
        """Where the workers are."""
        return self._broker

    @property
    def version(self) -> int:
        """Grows by one at each change."""
        return self._version

    def wait_change(self, version: int, timeout_s: float) -> int:
        """Block until the version differs from ``version`` (or ``timeout_s``); the version."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version or self._stop.is_set(), timeout_s)
            return self._version

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, JSON-ready."""
        with self._cond:
            return {
                "version": self._version,
                "exchange": self.exchange,
                "broker": self._broker.public_uri,
                "error": self._error,
                "workers": list(self._workers),
                "history": list(self._history),
                "events": list(self._recent),
                "poll_period_s": self._period,
                "events_enabled": self._events,
            }

    # --- feeding ---

    def poll_once(self) -> None:
        """Ask every worker for its stats once and record what changed."""
        assert self._client is not None, "start() first"
        with self._cond:
            # Events that arrived before this round asks are shown with its answers.
            arrived, self._pending = self._pending, []
        try:
            answers = self._client.ask("stats", timeout_s=ANSWER_TIMEOUT_S)
            error = None
        except Exception as e:
            LOG.warning("Dashboard could not ask the workers: %s", e)
            answers, error = [], f"{type(e).__name__}: {e}"
        now = time.time()
        workers, succeeded, failed = [], 0, 0
        totals_now: dict[str, tuple[int, int]] = {}
        for answer in sorted(answers, key=lambda a: a.worker_id):
            if not answer.ok:
                continue
            worker = dict(answer.result.get("worker", {}))
            stats = answer.result.get("stats", {})
            worker["stats"] = {k: v for k, v in stats.items() if k != "requests"}
            worker["requests"] = stats.get("requests", [])
            workers.append(worker)
            totals = stats.get("totals", {})
            pair = (int(totals.get("succeeded", 0)), int(totals.get("failed", 0)))
            totals_now[answer.worker_id] = pair
            before = self._last_totals.get(answer.worker_id)
            if before is not None:
                succeeded += max(0, pair[0] - before[0])
                failed += max(0, pair[1] - before[1])
        with self._cond:
            self._recent.extendleft(arrived)
            self._workers = workers
            self._last_totals = totals_now
            dt = None if self._last_round_at is None else now - self._last_round_at
            self._last_round_at = now
            self._history.append(
                {
                    "t": now,
                    "dt": dt,
                    "succeeded": succeeded,
                    "failed": failed,
                    # Per second of the time that really passed since the last round.
                    "succeeded_per_s": succeeded / dt if dt else 0.0,
                    "failed_per_s": failed / dt if dt else 0.0,
                }
            )
            self._error = error
            self._version += 1
            self._cond.notify_all()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._poke.wait(self._period)
            self._poke.clear()

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = str(event.get("type", ""))
        if kind == "worker-heartbeat":
            return
        asks_round = kind.startswith("task-") or kind.startswith("worker-")
        shown = {
            k: event.get(k)
            for k in ("type", "timestamp", "hostname", "uuid", "name", "state", "flow_name")
        }
        with self._cond:
            if asks_round:
                self._pending.append(shown)
            else:
                self._recent.appendleft(shown)
                self._version += 1
                self._cond.notify_all()
        if asks_round:
            # Ask the workers now; that round publishes this event with their
            # answers, so the page never shows it next to older figures.
            self._poke.set()
