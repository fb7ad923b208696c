"""Server: the worker side of the protocol (answers NOTIFY, runs REQUESTs).

The consume loop only validates, routes and submits: NOTIFY is answered right
there (so discovery never queues behind busy task threads), and each REQUEST
runs on the executor, which publishes RUNNING, EVENT (progress) and the
outcome. Nothing a message contains can make the server run anything but the
endpoints it was given; bad input is rejected with a logged reason and, when
a reply address is known, a FAILURE reply.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import dispatcher as dispatcher_mod
from flowengine.engines.worker_based import endpoint as endpoint_mod
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import proxy as proxy_mod
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

#: Seconds between repeated RUNNING replies for each running request: a
#: heartbeat the executor can use to tell a slow task from a dead worker.
RUNNING_HEARTBEAT_PERIOD_S = 5.0

#: Seconds between repeated announcements (executors forget a worker after
#: worker_expiry seconds of silence; a topic NOTIFY reaches only one of the
#: workers sharing the topic queue, so each worker speaks up by itself).
ANNOUNCE_PERIOD_S = pr.NOTIFY_PERIOD_S


def _failure_from(error: BaseException) -> ft.Failure:
    """A Failure for an exception created (not raised) here: no traceback to show."""
    return ft.Failure.from_exception(error)


class _Running:
    """Book-keeping for one request being run (for heartbeats and duplicates)."""

    __slots__ = ("reply_to", "task_uuid", "started")

    def __init__(self, reply_to: str, task_uuid: str) -> None:
        self.reply_to = reply_to
        self.task_uuid = task_uuid
        self.started = False


class Server:
    """Serves task requests for one topic from one exchange, using ``executor``."""

    def __init__(self, topic: str, exchange: str, executor: Any,
                 endpoints: Iterable[endpoint_mod.Endpoint], url: str | None = None,
                 transport: str | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 retry_options: Mapping[str, Any] | None = None,
                 worker_id: str | None = None) -> None:
        self._topic = topic
        self._exchange = exchange
        self._executor = executor
        self._endpoints = {ep.name: ep for ep in endpoints}
        self._tasks = sorted(self._endpoints)
        self._worker_id = worker_id or pr.make_worker_id()
        self._origin = pr.make_origin()
        self._running: dict[tuple[str, str], _Running] = {}
        self._running_lock = threading.Lock()
        self._last_heartbeat = time.monotonic()
        self._last_announce = time.monotonic()
        self._started_once = False
        private_key = pr.worker_routing_key(topic, self._worker_id)
        queues = [
            proxy_mod.QueueSpec(pr.topic_queue_name(exchange, topic), (topic,),
                                auto_delete=False),
            proxy_mod.QueueSpec(pr.worker_queue_name(exchange, topic, self._worker_id),
                                (private_key,), auto_delete=True),
        ]
        handlers = {
            pr.NOTIFY: dispatcher_mod.Handler(
                self._process_notify,
                validator=functools.partial(pr.Notify.validate, response=False),
                required_properties=("reply_to",)),
            pr.REQUEST: dispatcher_mod.Handler(
                self._process_request, validator=pr.Request.validate,
                required_properties=("reply_to", "correlation_id")),
        }
        self._proxy = proxy_mod.Proxy(topic, exchange, type_handlers=handlers,
                                      on_wait=self._on_wait, url=url, transport=transport,
                                      transport_options=transport_options,
                                      retry_options=retry_options, queues=queues,
                                      wake_routing_key=private_key, on_reject=self._on_reject,
                                      on_start=self._on_start)

    # --- facts ---

    @property
    def worker_id(self) -> str:
        """Unique id of this worker (header ``worker_id`` of its messages)."""
        return self._worker_id

    @property
    def topic(self) -> str:
        """The topic served."""
        return self._topic

    @property
    def tasks(self) -> list[str]:
        """Task class names served (sorted)."""
        return list(self._tasks)

    @property
    def proxy(self) -> proxy_mod.Proxy:
        """The proxy used to talk to the broker."""
        return self._proxy

    @property
    def connection_details(self) -> proxy_mod.ConnectionDetails:
        """Connection details (password masked)."""
        return self._proxy.connection_details

    @property
    def running_count(self) -> int:
        """How many requests are submitted or running right now."""
        with self._running_lock:
            return len(self._running)

    # --- lifecycle ---

    def start(self) -> None:
        """Serve until stop() (blocks the calling thread)."""
        self._proxy.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the server consumes; False if ``timeout`` passed first."""
        return self._proxy.wait(timeout)

    def stop(self) -> None:
        """Say goodbye to executors and stop consuming (running tasks go on)."""
        if self._proxy.is_running:
            self._announce(leaving=True)
        self._proxy.stop()

    # --- publishing helpers ---

    def _headers(self, **extra: Any) -> dict[str, Any]:
        headers = {pr.HEADER_WORKER_ID: self._worker_id, pr.HEADER_ORIGIN: self._origin}
        headers.update(extra)
        return headers

    def _announce(self, leaving: bool = False) -> None:
        """Tell every executor who we are and what we run (or that we leave)."""
        tasks = [] if leaving else self._tasks
        headers = self._headers(**({pr.HEADER_LEAVING: True} if leaving else {}))
        try:
            self._proxy.publish(pr.Notify(topic=self._topic, tasks=tasks),
                                pr.ANNOUNCE_ROUTING_KEY, headers=headers)
        except Exception:
            LOG.warning("Worker %s could not announce itself%s", self._worker_id,
                        " leaving" if leaving else "", exc_info=True)
        self._last_announce = time.monotonic()

    def _reply(self, reply_to: str, task_uuid: str, state: str, **data: Any) -> bool:
        """Publish a Response; False (logged) when it could not be sent."""
        try:
            self._proxy.publish(pr.Response(state, **data), reply_to,
                                correlation_id=task_uuid, headers=self._headers())
        except Exception:
            LOG.error("Failed to send %s reply for request %s to %s", state, task_uuid,
                      reply_to, exc_info=True)
            return False
        return True

    def _reply_failure(self, reply_to: str, task_uuid: str, error: BaseException) -> bool:
        """Publish a FAILURE reply describing ``error``."""
        return self._reply(reply_to, task_uuid, pr.FAILURE, result=_failure_from(error))

    # --- consume-loop callbacks ---

    def _on_start(self) -> None:
        """Consuming (again): announce ourselves at once (no waiting to be polled)."""
        if not self._started_once:
            self._started_once = True
            LOG.info("Worker %s serves topic %r with %d task(s)", self._worker_id,
                     self._topic, len(self._tasks))
        self._announce()

    def _on_wait(self) -> None:
        """Periodic work beside the request path: heartbeats and re-announcing."""
        now = time.monotonic()
        if now - self._last_announce >= ANNOUNCE_PERIOD_S:
            self._announce()
        if now - self._last_heartbeat >= RUNNING_HEARTBEAT_PERIOD_S:
            self._last_heartbeat = now
            with self._running_lock:
                started = [r for r in self._running.values() if r.started]
            for running in started:
                self._reply(running.reply_to, running.task_uuid, pr.RUNNING)

    def _on_reject(self, message: Any, reason: str) -> None:
        """Answer a refused request with FAILURE when we know where and for what."""
        props = message.properties or {}
        reply_to, task_uuid = props.get("reply_to"), props.get("correlation_id")
        if not reply_to or not task_uuid:
            return
        # Never answer a NOTIFY or a RESPONSE: two confused peers must not
        # bounce failures at each other forever.
        if props.get("type") in (pr.NOTIFY, pr.RESPONSE):
            return
        error = exc.InvalidFormat(f"Worker {self._worker_id} (topic {self._topic!r})"
                                  f" rejected request {task_uuid}: {reason}")
        self._reply_failure(reply_to, task_uuid, error)

    def _process_notify(self, data: Any, message: Any) -> None:
        """Answer a NOTIFY request with our topic and tasks (on the consumer thread)."""
        reply_to = message.properties["reply_to"]
        try:
            self._proxy.publish(pr.Notify(topic=self._topic, tasks=self._tasks), reply_to,
                                correlation_id=message.properties.get("correlation_id"),
                                headers=self._headers())
        except Exception:
            LOG.warning("Failed to answer NOTIFY from %s", reply_to, exc_info=True)

    def _process_request(self, data: dict[str, Any], message: Any) -> None:
        """Check a validated request and hand it to the executor; never raises."""
        props = message.properties
        reply_to, task_uuid = props["reply_to"], props["correlation_id"]
        headers = message.headers or {}
        try:
            expires = pr.parse_expires(headers.get(pr.HEADER_EXPIRES))
        except exc.InvalidFormat as e:
            self._reply_failure(reply_to, task_uuid, e)
            return
        if expires is not None and time.time() > expires:
            LOG.info("Dropped request %s for task %r unrun: it expired %.3f s ago and"
                     " nobody waits for it any more", task_uuid, data.get("task_name"),
                     time.time() - expires)
            return
        try:
            work = pr.Request.from_dict(data, task_uuid=task_uuid)
        except Exception as e:
            self._reply_failure(reply_to, task_uuid, exc.InvalidFormat(
                f"Request {task_uuid} could not be decoded: {e}", cause=e))
            return
        endpoint = self._endpoints.get(work.task_cls)
        if endpoint is None:
            LOG.warning("Request %s names task class %r, which worker %s does not serve",
                        task_uuid, work.task_cls, self._worker_id)
            self._reply_failure(reply_to, task_uuid, exc.UnknownTask(
                f"Worker {self._worker_id} (topic {self._topic!r}) has no task class"
                f" {work.task_cls!r}; it serves {self._tasks}"))
            return
        key = (task_uuid, work.action)
        with self._running_lock:
            if key in self._running:
                LOG.warning("Ignored a duplicate of request %s (%s of %r): it is already"
                            " running here", task_uuid, work.action, work.task_name)
                return
            self._running[key] = _Running(reply_to, task_uuid)
        try:
            task = endpoint.generate(name=work.task_name)
        except Exception as e:
            self._forget(key)
            LOG.warning("Could not create task %r of class %s", work.task_name,
                        work.task_cls, exc_info=True)
            self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
                f"Worker {self._worker_id} could not create task {work.task_name!r} of"
                f" class {work.task_cls}: {e}", cause=e))
            return
        try:
            self._executor.submit(self._run, endpoint, task, work, key)
        except Exception as e:
            self._forget(key)
            self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
                f"Worker {self._worker_id} could not schedule request {task_uuid}: {e}",
                cause=e))

    # --- executor side ---

    def _forget(self, key: tuple[str, str]) -> None:
        with self._running_lock:
            self._running.pop(key, None)

    def _run(self, endpoint: endpoint_mod.Endpoint, task: Any, work: pr.WorkUnit,
             key: tuple[str, str]) -> None:
        """Run one request on an executor thread and send its replies."""
        task_uuid = key[0]
        with self._running_lock:
            running = self._running.get(key)
        if running is None:  # pragma: no cover - registered before submit
            return
        reply_to = running.reply_to
        try:
            if not self._reply(reply_to, task_uuid, pr.RUNNING):
                LOG.error("Request %s for task %r not run: its RUNNING reply could not"
                          " be sent", task_uuid, work.task_name)
                return
            running.started = True
            started = time.monotonic()
            progress = functools.partial(self._on_event, reply_to, task_uuid)
            method = endpoint.execute if work.action == pr.EXECUTE else endpoint.revert
            result = method(task, progress_callback=progress, **work.arguments)
            elapsed = time.monotonic() - started
            state = pr.FAILURE if isinstance(result, ft.Failure) else pr.SUCCESS
            self._send_outcome(reply_to, task_uuid, work, state, result)
            LOG.info("Task %r (%s) %s for request %s finished in %.3f s: %s",
                     work.task_name, work.task_cls, work.action, task_uuid, elapsed, state)
        except Exception:
            LOG.exception("Unexpected error running request %s", task_uuid)
        finally:
            self._forget(key)

    def _send_outcome(self, reply_to: str, task_uuid: str, work: pr.WorkUnit, state: str,
                      result: Any) -> None:
        """Publish SUCCESS/FAILURE; an unencodable outcome becomes a FAILURE naming why."""
        try:
            self._proxy.publish(pr.Response(state, result=result), reply_to,
                                correlation_id=task_uuid, headers=self._headers())
            return
        except exc.SerializationFailure as e:
            what = "result" if state == pr.SUCCESS else "failure"
            error = exc.SerializationFailure(
                f"The {what} of task {work.task_name!r} ({work.task_cls}, {work.action})"
                f" cannot be sent as JSON: {e.cause or e}")
            LOG.warning("Request %s: %s", task_uuid, error.args[0])
        except Exception:
            LOG.error("Failed to send %s reply for request %s to %s", state, task_uuid,
                      reply_to, exc_info=True)
            return
        self._reply_failure(reply_to, task_uuid, error)

    def _on_event(self, reply_to: str, task_uuid: str, event_type: str,
                  details: dict[str, Any]) -> None:
        """Forward a task notification (progress) to the executor as an EVENT."""
        try:
            self._proxy.publish(pr.Response(pr.EVENT, event_type=event_type,
                                            details=dict(details or {})),
                                reply_to, correlation_id=task_uuid, headers=self._headers())
        except Exception:
            LOG.warning("Failed to send %s event for request %s", event_type, task_uuid,
                        exc_info=True)
