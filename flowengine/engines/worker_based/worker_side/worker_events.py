"""A worker's events (online/heartbeat/offline and every request's life), as a middleware.

Each hook builds its event's fields and hands it to an
:class:`~flowengine.engines.worker_based.events.EventPublisher`; with events
off every hook returns at once. One publisher for the worker: its topics
(one consume loop each) go online, heartbeat and offline on their own, and
the publisher is closed once the last one went offline. Events are signed
with the worker's keyring when it has one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine.engines.worker_based.events import hooks as event_hooks
from flowengine.engines.worker_based.events import model
from flowengine.engines.worker_based.events.publisher import EventPublisher
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import clock
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.worker_side.middleware import Job, Middleware
from flowengine.types import failure as ft


class _Request:
    """What the worker remembers about a request between its events."""

    __slots__ = ("fields", "started_mono", "started")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.started_mono: float | None = None
        self.started: float | None = None


class _Topic:
    """One consume loop's share of the worker's events (its counts, its heartbeat)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.requests: dict[str, _Request] = {}
        self.processed = 0
        self.last_heartbeat = 0.0


class EventsMiddleware(Middleware):
    """Publishes a worker's events (see :mod:`flowengine.engines.worker_based.events`)."""

    def __init__(
        self, publisher: EventPublisher, worker_id: str, topics: Iterable[str], tasks: Iterable[str]
    ) -> None:
        self.publisher = publisher
        self.enabled = publisher.enabled
        self._worker_id = worker_id
        self._tasks = list(tasks)
        self._lock = threading.Lock()
        self._topics = {topic: _Topic(topic) for topic in topics}
        # Topics not gone offline yet: the publisher closes after the last.
        self._open = set(self._topics)

    @classmethod
    def create(
        cls,
        exchange: str,
        worker_id: str,
        topics: Iterable[str],
        tasks: Iterable[str],
        broker: BrokerSettings,
        enabled: bool | None = None,
    ) -> EventsMiddleware:
        """Events for one worker (``enabled=None``: ``events.hooks.EVENTS_BY_DEFAULT``).

        Signed with the worker's keys (``broker.keyring``) when it has any.
        """
        enabled = event_hooks.EVENTS_BY_DEFAULT if enabled is None else bool(enabled)
        # The worker id names the sender: unique even for workers sharing a process.
        publisher = EventPublisher(
            exchange,
            hostname=worker_id,
            enabled=enabled,
            secret=broker.keyring if enabled else None,
            broker=broker,
        )
        return cls(publisher, worker_id, topics, tasks)

    def _topic(self, topic: str) -> _Topic:
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                state = self._topics[topic] = _Topic(topic)
            return state

    def _base(self, topic: str) -> dict[str, Any]:
        return {"worker_id": self._worker_id, "topic": topic}

    def _worker(self, state: _Topic, event_type: str, **fields: Any) -> None:
        with self._lock:
            active, processed = len(state.requests), state.processed
        self.publisher.send(
            event_type,
            active=active,
            processed=processed,
            freq=model.HEARTBEAT_PERIOD_S,
            **self._base(state.topic),
            **fields,
        )

    # --- the consume loops ---

    def after_consumer_start(self, topic: str) -> None:
        """worker-online: the topic's loop consumes (again)."""
        if self.enabled:
            state = self._topic(topic)
            state.last_heartbeat = time.monotonic()
            self._worker(state, "worker-online", tasks=self._tasks)

    def on_consumer_period(self, topic: str) -> None:
        """worker-heartbeat when one is due."""
        if not self.enabled:
            return
        state = self._topic(topic)
        if time.monotonic() - state.last_heartbeat >= model.HEARTBEAT_PERIOD_S:
            state.last_heartbeat = time.monotonic()
            with self._lock:
                running = sorted(state.requests)
            self._worker(state, "worker-heartbeat", running=running)

    def after_server_stop(self, topic: str) -> None:
        """worker-offline; flush and close once the last topic went offline."""
        if not self.enabled:
            return
        self._worker(self._topic(topic), "worker-offline")
        with self._lock:
            self._open.discard(topic)
            last = not self._open
        if last:
            self.publisher.close()

    # --- one request ---

    @staticmethod
    def _request_fields(headers: Headers) -> dict[str, Any]:
        """What a request's headers say in its events: trace id, attempt, timings."""
        return {
            "root_id": headers.root_id,
            "attempt": 0 if headers.attempt is None else headers.attempt,
            **model.request_timings(headers),
        }

    def after_receive(self, job: Job) -> None:
        """task-received."""
        if not self.enabled:
            return
        work = job.work
        fields = {
            "uuid": job.task_uuid,
            "name": work.task_name,
            "task_cls": work.task_cls,
            "action": work.action,
            **self._request_fields(job.headers),
            **self._base(job.topic),
        }
        state = self._topic(job.topic)
        with self._lock:
            state.requests[job.task_uuid] = _Request(fields)
        self.publisher.send("task-received", **fields)

    def after_expire(
        self, topic: str, task_uuid: str, task_name: str | None, headers: Headers
    ) -> None:
        """task-expired: dropped unrun."""
        if self.enabled:
            self.publisher.send(
                "task-expired",
                uuid=task_uuid,
                name=task_name,
                **self._request_fields(headers),
                **self._base(topic),
            )

    def _received(self, job: Job) -> _Request | None:
        """The request announced by task-received (None: events off, or not announced)."""
        if not self.enabled:
            return None
        state = self._topic(job.topic)
        with self._lock:
            return state.requests.get(job.task_uuid)

    def before_execute(self, job: Job) -> None:
        """task-started."""
        request = self._received(job)
        if request is None:
            return
        request.started_mono, request.started = time.monotonic(), clock.wall()
        self.publisher.send("task-started", **request.fields, started=request.started)

    def on_progress(self, job: Job, event_type: str, details: Mapping[str, Any]) -> None:
        """task-progress."""
        request = self._received(job)
        if request is None:
            return
        progress = (details or {}).get("progress")
        self.publisher.send(
            "task-progress", **request.fields, notification=event_type, progress=progress
        )

    def after_execute(self, job: Job, result: Any, elapsed_s: float) -> None:
        """task-succeeded or task-failed, before the outcome is sent.

        Before: an execute and its revert share a uuid, and the revert (sent
        once the engine has the outcome) must not find the execute still
        tracked here.
        """
        if not self.enabled:
            return
        state = self._topic(job.topic)
        with self._lock:
            request = state.requests.pop(job.task_uuid, None)
            state.processed += 1
            processed = state.processed
        if request is None:
            return
        ended = clock.wall()
        runtime = (
            time.monotonic() - request.started_mono if request.started_mono is not None else None
        )
        # The worker's count rides along: a view need not wait for a heartbeat.
        fields = dict(
            request.fields,
            started=request.started,
            ended=ended,
            runtime=runtime,
            processed=processed,
        )
        if not isinstance(result, ft.Failure):
            self.publisher.send("task-succeeded", **fields)
        else:
            exc_text = getattr(result, "exception_str", None) or str(result)
            self.publisher.send("task-failed", **fields, exception=exc_text)

    def after_release(self, job: Job) -> None:
        """A request that will not run here (refused, expired) is no longer tracked."""
        if self.enabled:
            state = self._topic(job.topic)
            with self._lock:
                request = state.requests.get(job.task_uuid)
                # Only the very request: its revert may be tracked under the uuid.
                if request is not None and request.fields["action"] == job.work.action:
                    del state.requests[job.task_uuid]
