"""Worker discovery: which workers exist, what they run, where to route a task."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import clock, names
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.utils import reflection

LOG = logging.getLogger(__name__)

# Seconds between two NOTIFY broadcasts to every topic. Workers announce
# themselves when they start and stop, so this beat only refreshes liveness
# (and finds workers that missed our start); 5 s is TaskFlow's value.
NOTIFY_PERIOD_S = pr.NOTIFY_PERIOD_S

# Seconds of silence after which a worker is forgotten. Twelve missed beats
# at NOTIFY_PERIOD_S: long enough that a busy broker does not make live
# workers flap, short enough that dead ones stop receiving requests.
WORKER_EXPIRY_S = pr.EXPIRES_AFTER_S

_NO_IDENTITY = object()


def task_class_name(task: Any) -> str:
    """Return the class name a worker advertises for ``task`` (str passes through)."""
    if isinstance(task, str):
        return task
    return reflection.get_class_name(task)


class TopicWorker:
    """A (read-only) worker: its topic, the task classes it runs, its identity."""

    __slots__ = ("_topic", "_tasks", "_task_set", "_identity", "_worker_id", "_settles_after_run")
    _topic: str
    _tasks: tuple[str, ...]
    _task_set: frozenset[str]
    _identity: Any
    _worker_id: str | None
    _settles_after_run: bool

    def __init__(
        self,
        topic: str,
        tasks: Iterable[Any],
        identity: Any = _NO_IDENTITY,
        worker_id: str | None = None,
        settles_after_run: bool = False,
    ) -> None:
        names = tuple(task_class_name(t) for t in tasks)
        object.__setattr__(self, "_topic", topic)
        object.__setattr__(self, "_tasks", names)
        object.__setattr__(self, "_task_set", frozenset(names))
        object.__setattr__(self, "_identity", identity)
        object.__setattr__(self, "_worker_id", worker_id)
        object.__setattr__(self, "_settles_after_run", settles_after_run)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    @property
    def topic(self) -> str:
        """The topic the worker consumes from."""
        return self._topic

    @property
    def tasks(self) -> tuple[str, ...]:
        """Fully qualified class names of the tasks the worker can run."""
        return self._tasks

    @property
    def identity(self) -> Any:
        """What tells this worker apart from others on the same topic."""
        return self._identity

    @property
    def worker_id(self) -> str | None:
        """The worker's own id (None for workers that do not send one, e.g. TaskFlow's)."""
        return self._worker_id

    @property
    def settles_after_run(self) -> bool:
        """Whether the worker acknowledges a late request it runs inline only after its outcome.

        (Header ``settles_after_run``; see names.HEADER_SETTLES_AFTER_RUN.)
        """
        return self._settles_after_run

    @property
    def routing_key(self) -> str | None:
        """The routing key of the worker's private queue (None if it has none)."""
        if self._worker_id is None:
            return None
        return f"{self._topic}.{self._worker_id}"

    def performs(self, task: Any) -> bool:
        """Whether this worker can run ``task`` (a task, its class or its class name)."""
        return task_class_name(task) in self._task_set

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicWorker):
            return NotImplemented
        if self._topic != other._topic or self._task_set != other._task_set:
            return False
        if _NO_IDENTITY in (self._identity, other._identity):
            return True
        return bool(self._identity == other._identity)

    def __hash__(self) -> int:
        # Identity is left out so that equality with a wildcard identity stays
        # consistent with hashing.
        return hash((self._topic, self._task_set))

    def __repr__(self) -> str:
        ident = "*" if self._identity is _NO_IDENTITY else self._identity
        return f"TopicWorker(identity={ident}, tasks={list(self._tasks)}, topic={self._topic})"


class _Route:
    """Where requests for one task class may go, and a rotation over them."""

    __slots__ = ("destinations", "_cycle")

    def __init__(self, destinations: list[tuple[TopicWorker, str]]) -> None:
        self.destinations = destinations
        self._cycle = itertools.cycle(destinations) if destinations else None

    def pick(self) -> tuple[TopicWorker, str] | None:
        """Next destination (round robin) or None when nowhere can run it."""
        if self._cycle is None:
            return None
        return next(self._cycle)


class ProxyWorkerFinder:
    """Requests and receives responses about workers' topic + task details."""

    def __init__(
        self,
        uuid: str,
        proxy: Any,
        topics: Iterable[str],
        beat_periodicity: float | None = NOTIFY_PERIOD_S,
        worker_expiry: float | None = WORKER_EXPIRY_S,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._uuid = uuid
        self._proxy = proxy
        self._topics = list(topics)
        # Topics given: only their workers are used, whoever else announces
        # itself on the exchange (None: none given, any topic is learned).
        self._only_topics = frozenset(self._topics) or None
        self._beat_periodicity = beat_periodicity
        self._worker_expiry = worker_expiry
        self._on_change = on_change
        self._cond = threading.Condition()
        # identity -> TopicWorker; identity -> monotonic time last heard from.
        self._workers: dict[Any, TopicWorker] = {}
        self._last_seen: dict[Any, float] = {}
        # task class name -> _Route; rebuilt lazily after any membership change.
        self._routes: dict[str, _Route] = {}
        # routing key -> whether every worker it may reach settles after run.
        self._settling: dict[str, bool] = {}
        # Ids of the workers known; rebuilt lazily after any membership change
        # (every reply asks whether its worker is known).
        self._worker_ids: frozenset[str | None] | None = None
        self._messages_processed = 0
        self._messages_published = 0
        self._last_published: float | None = None
        self._clock: Callable[[], float] = time.monotonic

    @property
    def topics(self) -> list[str]:
        """Topics this finder sends NOTIFY requests to."""
        return list(self._topics)

    def add_topic(self, topic: str) -> None:
        """Include ``topic`` in future NOTIFY beats (a topic learned from an announcement)."""
        with self._cond:
            if topic not in self._topics:
                self._topics.append(topic)

    @property
    def total_workers(self) -> int:
        """Number of workers currently known."""
        return len(self._workers)

    @property
    def workers(self) -> list[TopicWorker]:
        """A snapshot of the workers currently known."""
        with self._cond:
            return list(self._workers.values())

    @property
    def messages_processed(self) -> int:
        """How many notify response messages have been processed."""
        return self._messages_processed

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Wait for at least ``workers`` workers; return how many are still missing."""
        if workers <= 0:
            raise ValueError("Worker amount must be greater than zero")
        # Real time here, whatever clock ages workers: this is a caller's wait.
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._workers) < workers:
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return max(0, workers - len(self._workers))

    def publish(self) -> None:
        """Send a NOTIFY request to every topic now (answers come to our reply queue).

        Each topic gets it twice: on its broadcast key, which every flowengine
        worker of the topic receives (their private queues are bound to it),
        and on the topic key, which reaches one of the workers consuming the
        shared topic queue (TaskFlow's workers only listen there).
        """
        with self._cond:
            keys = [
                key for topic in self._topics for key in (lv.broadcast_routing_key(topic), topic)
            ]
        if keys:
            # The send time lets workers follow our clock (wire/peer_clock.py).
            self._proxy.publish(
                pr.Notify(),
                keys,
                reply_to=self._uuid,
                headers={names.HEADER_ENQUEUED: clock.wall()},
            )
        self._messages_published += 1
        self._last_published = self._clock()

    def maybe_publish(self) -> bool:
        """Send NOTIFY to each topic if never sent or a beat period has passed."""
        if self._last_published is not None and self._beat_periodicity is not None:
            if self._clock() - self._last_published < self._beat_periodicity:
                return False
        self.publish()
        return True

    def seconds_to_next_beat(self) -> float | None:
        """Seconds until maybe_publish would send again (None: never)."""
        if self._beat_periodicity is None:
            return None
        if self._last_published is None:
            return 0.0
        return max(0.0, self._last_published + self._beat_periodicity - self._clock())

    def process_response(self, data: dict[str, Any], message: Any) -> TopicWorker | None:
        """Process a notify response or announcement; return the worker if new or changed."""
        headers = Headers.parse(getattr(message, "headers", None))
        topic = data["topic"]
        if self._only_topics is not None and topic not in self._only_topics:
            return None  # an announcement of a topic this engine was not given
        tasks = data["tasks"]
        worker_id = headers.worker_id
        if worker_id is not None:
            identity: Any = (topic, worker_id)
        else:
            # TaskFlow workers send no id: equal (topic, tasks) means one worker.
            identity = (topic, tuple(sorted(tasks)))
        leaving = headers.leaving
        changed: TopicWorker | None = None
        with self._cond:
            self._messages_processed += 1
            if leaving:
                gone = self._workers.pop(identity, None)
                self._last_seen.pop(identity, None)
                if gone is not None:
                    self._membership_changed()
                    LOG.info("Worker %s left (%d workers known)", gone, len(self._workers))
                return None
            current = self._workers.get(identity)
            candidate = TopicWorker(
                topic,
                tasks,
                identity=identity,
                worker_id=worker_id,
                settles_after_run=headers.settles_after_run,
            )
            if current is None or current != candidate:
                self._workers[identity] = candidate
                self._membership_changed()
                changed = candidate
                LOG.debug(
                    "Worker %s is %s (%d workers known)",
                    candidate,
                    "new" if current is None else "updated",
                    len(self._workers),
                )
            self._last_seen[identity] = self._clock()
        if changed is not None and self._on_change is not None:
            self._on_change()
        return changed

    def _membership_changed(self) -> None:
        """Invalidate routes and wake waiters (caller holds the condition)."""
        self._routes.clear()
        self._settling.clear()
        self._worker_ids = None
        self._cond.notify_all()

    def clean(self) -> int:
        """Forget workers silent for longer than the expiry; return how many."""
        expiry = self._worker_expiry
        if not self._workers or expiry is None or expiry <= 0:
            return 0
        now = self._clock()
        dead: list[tuple[TopicWorker, float]] = []
        with self._cond:
            for identity, seen in list(self._last_seen.items()):
                silent = now - seen
                if silent >= expiry:
                    dead.append((self._workers.pop(identity), silent))
                    del self._last_seen[identity]
            if dead:
                self._membership_changed()
        for worker, silent in dead:
            LOG.info(
                "Removed worker %s: it has not answered notifications for %0.3f s;"
                " no more requests will be sent to it",
                worker,
                silent,
            )
        return len(dead)

    def has_worker(self, worker_id: str) -> bool:
        """Whether a worker with this id is currently known."""
        known = self._worker_ids
        if known is None:
            with self._cond:
                known = self._worker_ids = frozenset(w.worker_id for w in self._workers.values())
        return worker_id in known

    def forget_worker(self, worker_id: str) -> int:
        """Forget the worker(s) with this id (e.g. found dead); return how many."""
        with self._cond:
            gone = [i for i, w in self._workers.items() if w.worker_id == worker_id]
            for identity in gone:
                del self._workers[identity]
                self._last_seen.pop(identity, None)
            if gone:
                self._membership_changed()
        return len(gone)

    def reset(self) -> None:
        """Forget every worker and all counters."""
        with self._cond:
            self._workers.clear()
            self._last_seen.clear()
            self._messages_processed = 0
            self._messages_published = 0
            self._last_published = None
            self._membership_changed()

    def _build_route(self, task_cls: str) -> _Route:
        """Compute every place a request for ``task_cls`` may be sent (caller holds lock)."""
        by_topic: dict[str, list[TopicWorker]] = {}
        for worker in self._workers.values():
            by_topic.setdefault(worker.topic, []).append(worker)
        destinations: list[tuple[TopicWorker, str]] = []
        for topic, members in by_topic.items():
            capable = [w for w in members if w.performs(task_cls)]
            if not capable:
                continue
            if len(capable) == len(members):
                # Every consumer of the topic queue can run it: let the broker
                # spread requests over them (one entry per worker keeps the
                # rotation weighted by how many workers share the topic).
                destinations.extend((w, topic) for w in capable)
                continue
            for w in capable:
                if w.routing_key is not None:
                    destinations.append((w, w.routing_key))
                else:
                    LOG.warning(
                        "Worker %s can run %s but shares topic %r with workers"
                        " that cannot and has no private queue; not routing"
                        " there",
                        w,
                        task_cls,
                        topic,
                    )
        return _Route(destinations)

    def settles_after_run(self, routing_key: str) -> bool:
        """Whether every known worker that ``routing_key`` reaches settles late requests after run.

        A topic's queue reaches every worker of the topic; a private queue
        its worker. False when none is known: a worker nobody has heard
        from yet may be one that does not (TaskFlow's, an older one).
        """
        known = self._settling.get(routing_key)
        if known is None:
            with self._cond:
                reached = [
                    w
                    for w in self._workers.values()
                    if w.topic == routing_key or w.routing_key == routing_key
                ]
                known = bool(reached) and all(w.settles_after_run for w in reached)
                self._settling[routing_key] = known
        return known

    def get_route_for_task(self, task: Any) -> tuple[TopicWorker, str] | None:
        """Pick (worker, routing key) for ``task``, spreading load; None if none can."""
        task_cls = task_class_name(task)
        with self._cond:
            route = self._routes.get(task_cls)
            if route is None:
                route = self._routes[task_cls] = self._build_route(task_cls)
            return route.pick()

    def get_worker_for_task(self, task: Any) -> TopicWorker | None:
        """Get a worker that can perform a given task (None if no known worker can)."""
        picked = self.get_route_for_task(task)
        return None if picked is None else picked[0]
