"""What workers and engines say on the event stream, called from one-line hooks.

The server and the engine call these methods at the points where things
happen; each builds the event's fields and hands it to an
:class:`~flowengine.engines.worker_based.events.EventPublisher`. With events
disabled every call returns at once. When the sender signs its messages
(it has a keyring) its events are signed with the same keyring.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine import states
from flowengine.engines.base import Engine
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.events import model
from flowengine.engines.worker_based.events.publisher import EventPublisher
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import clock
from flowengine.engines.worker_based.wire.headers import Headers

#: Whether workers and engines publish events when not told: off, because
#: publishing costs a broker write per event (see doc/source/events.rst for
#: the measured cost) and most deployments never watch.
EVENTS_BY_DEFAULT = False


class _Request:
    """What the worker remembers about a request between its events."""

    __slots__ = ("fields", "started_mono", "started")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.started_mono: float | None = None
        self.started: float | None = None


class WorkerEvents:
    """A worker's events: online/heartbeat/offline and every request's life."""

    def __init__(self, publisher: EventPublisher, worker_id: str, topic: str,
                 tasks: Iterable[str]) -> None:
        self.publisher = publisher
        self.enabled = publisher.enabled
        self._base = {"worker_id": worker_id, "topic": topic}
        self._tasks = list(tasks)
        self._requests: dict[str, _Request] = {}
        self._lock = threading.Lock()
        self._processed = 0
        self._last_heartbeat = 0.0

    @classmethod
    def create(cls, exchange: str, worker_id: str, topic: str, tasks: Iterable[str],
               broker: BrokerSettings, enabled: bool | None = None) -> WorkerEvents:
        """Events for one worker (``enabled=None``: :data:`EVENTS_BY_DEFAULT`).

        Signed with the worker's keys (``broker.keyring``) when it has any.
        """
        enabled = EVENTS_BY_DEFAULT if enabled is None else bool(enabled)
        # The worker id names the sender: unique even for workers sharing a process.
        publisher = EventPublisher(
            exchange, hostname=worker_id, enabled=enabled,
            secret=broker.keyring if enabled else None, broker=broker)
        return cls(publisher, worker_id, topic, tasks)

    def _worker(self, event_type: str, **fields: Any) -> None:
        with self._lock:
            active, processed = len(self._requests), self._processed
        self.publisher.send(event_type, active=active, processed=processed,
                            freq=model.HEARTBEAT_PERIOD_S, **self._base, **fields)

    def online(self) -> None:
        """The worker consumes (again)."""
        if self.enabled:
            self._last_heartbeat = time.monotonic()
            self._worker("worker-online", tasks=self._tasks)

    def heartbeat(self) -> None:
        """Called often from the consume loop: a heartbeat when one is due."""
        if self.enabled and time.monotonic() - self._last_heartbeat >= model.HEARTBEAT_PERIOD_S:
            self._last_heartbeat = time.monotonic()
            with self._lock:
                running = sorted(self._requests)
            self._worker("worker-heartbeat", running=running)

    def offline(self) -> None:
        """The worker stops; flush what is buffered."""
        if self.enabled:
            self._worker("worker-offline")
            self.publisher.close()

    def received(self, task_uuid: str, work: pr.WorkUnit, headers: Headers) -> None:
        """A valid request was accepted and is about to be submitted."""
        if not self.enabled:
            return
        fields = {"uuid": task_uuid, "name": work.task_name, "task_cls": work.task_cls,
                  "action": work.action, **self._request_fields(headers), **self._base}
        with self._lock:
            self._requests[task_uuid] = _Request(fields)
        self.publisher.send("task-received", **fields)

    def expired(self, task_uuid: str, task_name: str | None, headers: Headers) -> None:
        """A request arrived after its deadline and was dropped unrun."""
        if self.enabled:
            self.publisher.send("task-expired", uuid=task_uuid, name=task_name,
                                **self._request_fields(headers), **self._base)

    @staticmethod
    def _request_fields(headers: Headers) -> dict[str, Any]:
        """What a request's headers say in its events: trace id, attempt, timings."""
        return {"root_id": headers.root_id,
                "attempt": 0 if headers.attempt is None else headers.attempt,
                **model.request_timings(headers)}

    def forget(self, task_uuid: str) -> None:
        """A received request will not run here (refused after task-received)."""
        if self.enabled:
            with self._lock:
                self._requests.pop(task_uuid, None)

    def _received(self, task_uuid: str) -> _Request | None:
        """The request announced by task-received (None: events off, or not announced)."""
        if not self.enabled:
            return None
        with self._lock:
            return self._requests.get(task_uuid)

    def started(self, task_uuid: str) -> None:
        """The request's task starts running."""
        request = self._received(task_uuid)
        if request is None:
            return
        request.started_mono, request.started = time.monotonic(), clock.wall()
        self.publisher.send("task-started", **request.fields, started=request.started)

    def progress(self, task_uuid: str, event_type: str, details: Mapping[str, Any]) -> None:
        """The task reported progress (or another notification)."""
        request = self._received(task_uuid)
        if request is None:
            return
        progress = (details or {}).get("progress")
        self.publisher.send("task-progress", **request.fields, notification=event_type,
                            progress=progress)

    def finished(self, task_uuid: str, succeeded: bool, result: Any = None) -> None:
        """The task ended; its outcome was (or is about to be) sent."""
        if not self.enabled:
            return
        with self._lock:
            request = self._requests.pop(task_uuid, None)
            self._processed += 1
            processed = self._processed
        if request is None:
            return
        ended = clock.wall()
        runtime = (time.monotonic() - request.started_mono
                   if request.started_mono is not None else None)
        # The worker's count rides along: a view need not wait for a heartbeat.
        fields = dict(request.fields, started=request.started, ended=ended, runtime=runtime,
                      processed=processed)
        if succeeded:
            self.publisher.send("task-succeeded", **fields)
        else:
            exc_text = getattr(result, "exception_str", None) or str(result)
            self.publisher.send("task-failed", **fields, exception=exc_text)


class FlowEvents:
    """An engine's events: flow-started/flow-finished and task-retried."""

    #: Flow states that end a run.
    FINAL_STATES = (states.SUCCESS, states.FAILURE, states.REVERTED, states.SUSPENDED)

    def __init__(self, publisher: EventPublisher) -> None:
        self.publisher = publisher
        self.root_id: str | None = None
        # Retries of each controller in the current run (its events' attempt).
        self._retries: dict[str | None, int] = {}

    @classmethod
    def from_options(cls, options: Mapping[str, Any], exchange: str) -> FlowEvents:
        """Events for an engine, from its ``events``/``url``/``transport*``/``secret`` options.

        Events are signed with the keys the engine's executor signs with:
        the ``secret`` option, else ``$FLOWENGINE_SECRET_FILE`` /
        ``$FLOWENGINE_SECRET`` (read only when events are on).
        """
        enabled = options.get("events")
        enabled = EVENTS_BY_DEFAULT if enabled is None else bool(enabled)
        if options.get("broker") is not None:
            # The engine's own broker settings (checked by its executor);
            # their keys are read only when events are on.
            broker = BrokerSettings.from_options(options)
            if not enabled:
                broker = dataclasses.replace(broker, secret=False)
        else:
            broker = BrokerSettings(url=options.get("url"), transport=options.get("transport"),
                                    transport_options=options.get("transport_options") or {},
                                    secret=options.get("secret") if enabled else False)
        publisher = EventPublisher(
            exchange,
            hostname=f"engine:{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}",
            enabled=enabled, secret=broker.keyring, broker=broker)
        return cls(publisher)

    def attach(self, engine: Engine) -> None:
        """Listen to ``engine``'s flow and atom notifications."""
        if not self.publisher.enabled:
            return
        engine.notifier.register(engine.notifier.ANY, self._on_flow)
        engine.atom_notifier.register(engine.atom_notifier.ANY, self._on_atom)

    def _on_flow(self, state: str, details: Mapping[str, Any]) -> None:
        fields = {"root_id": details.get("flow_uuid"), "flow_name": details.get("flow_name"),
                  "state": state}
        if state == states.RUNNING:
            self.root_id = details.get("flow_uuid")
            self._retries.clear()
            self.publisher.send("flow-started", **fields)
        elif state in self.FINAL_STATES:
            self.publisher.send("flow-finished", **fields)
            # The caller may exit right after run(): get the news out first,
            # and hold no thread or connection until the next run.
            self.publisher.idle()

    def _on_atom(self, state: str, details: Mapping[str, Any]) -> None:
        if state == states.RETRYING:
            # The atom's uuid is the uuid of its requests (a retried atom is
            # requested again under it), so a view can follow it as a request.
            atom_uuid: str | None = details.get("retry_uuid") or details.get("atom_uuid")
            attempt = self._retries[atom_uuid] = self._retries.get(atom_uuid, 0) + 1
            self.publisher.send("task-retried", uuid=atom_uuid, retry_uuid=atom_uuid,
                                name=details.get("retry_name") or details.get("atom_name"),
                                root_id=self.root_id, attempt=attempt, state=state)

    def close(self) -> None:
        """Flush and stop publishing."""
        self.publisher.close()
