"""Requests no known worker can run: warn once, early, and say why when they time out.

A request for a task that no discovered worker serves waits (a worker may
still start). When it is a mistake (a wrong exchange or topic, a task the
workers were not given), the user should not learn it only at the
transition timeout, a minute later, from a bare "expired": the executor
warns as soon as discovery had its chance, naming the task, the topics and
what the known workers do serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from flowengine.engines.worker_based.executor_side import discovery
from flowengine.engines.worker_based.executor_side import tracking as tr

LOG = logging.getLogger(__name__)

#: Seconds a request may wait for a capable worker before the warning: a
#: discovery round trip takes milliseconds even on a loaded machine, so a
#: second without an answer means no such worker is there now.
UNSERVED_WARNING_AFTER_S = 1.0


class UnservedWatch:
    """Warns once per task class whose requests wait with no capable worker known."""

    def __init__(self, exchange: str, finder: discovery.ProxyWorkerFinder) -> None:
        self._exchange = exchange
        self._finder = finder
        self._warned: set[str] = set()

    def describe(self, task_name: str) -> str:
        """Why requests for ``task_name`` cannot be dispatched, in words a user can act on."""
        topics = ", ".join(repr(t) for t in self._finder.topics)
        served = sorted({name for worker in self._finder.workers for name in worker.tasks})
        if served:
            known = f"the workers there serve only {', '.join(served)}"
        else:
            known = "no worker answered there"
        return (
            f"no worker serving task {task_name!r} is known on topic(s) {topics} of"
            f" exchange {self._exchange!r} ({known}); check the workers' --exchange,"
            f" --topic and --tasks"
        )

    def check(self, waiting: Iterable[tr.Tracked], now: float) -> float | None:
        """Warn about requests waiting too long; seconds until the next one is due (None: none)."""
        next_due: float | None = None
        for tracked in waiting:
            name = discovery.task_class_name(tracked.request.task)
            if name in self._warned or tracked.waiting_since is None:
                continue
            due = tracked.waiting_since + UNSERVED_WARNING_AFTER_S
            if due <= now:
                self._warned.add(name)
                LOG.warning("Request %s waits: %s", tracked.request, self.describe(name))
            elif next_due is None or due < next_due:
                next_due = due
        return None if next_due is None else max(0.0, next_due - time.monotonic())
