"""Server: the worker side of the protocol (answers NOTIFY, runs REQUESTs).

The consume loop only validates, routes and submits: NOTIFY is answered right
there, and each REQUEST runs on the executor, which publishes RUNNING, EVENT
(progress) and the outcome. Nothing a message contains can make the server
run anything but the endpoints it was given; bad input is rejected with a
logged reason and, when a reply address is known, a FAILURE reply.

Reliability (see doc/source/reliability.rst):

* a request message is acknowledged when it is received, and from then on
  this worker answers for it: a flowengine executor is told at once
  (PENDING with this worker's id) and a heartbeat thread of its own repeats
  PENDING/RUNNING for every request held until its outcome is sent;
* the consume loop takes no new message while more than ``capacity``
  requests are held (bounded prefetch: no worker hoards a queue);
* a request past its ``expires`` is dropped unrun, on receipt or when a
  thread would start it, with a FAILURE (RequestExpired) reply;
* a duplicate of a request held or recently finished is answered from the
  worker's memory (request_memory.py), never run again.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import compat as compat_mod
from flowengine.engines.worker_based import context as context_mod
from flowengine.engines.worker_based import dispatcher as dispatcher_mod
from flowengine.engines.worker_based import endpoint as endpoint_mod
from flowengine.engines.worker_based import event_hooks
from flowengine.engines.worker_based import liveness as lv
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import proxy as proxy_mod
from flowengine.engines.worker_based import request_memory as rm
from flowengine.engines.worker_based import running as running_mod
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

#: Default seconds between heartbeats of each held request (TaskFlow's name
#: of the old constant kept as an alias); see liveness.HEARTBEAT_INTERVAL_S.
RUNNING_HEARTBEAT_PERIOD_S = lv.HEARTBEAT_INTERVAL_S

#: Seconds between repeated announcements (executors forget a worker after
#: worker_expiry seconds of silence; they are sent by the heartbeat thread,
#: so a consume loop waiting for room never makes a worker look dead).
ANNOUNCE_PERIOD_S = pr.NOTIFY_PERIOD_S

#: Requests a worker holds (queued + running) per thread of its pool before
#: it stops taking more: one running and one ready to start the moment a
#: thread frees, as dramatiq does; more would strand work on a busy worker.
HELD_PER_THREAD = 2

#: Messages the broker may push to the consumer before it acknowledges them
#: (per queue): the worker acknowledges on receipt, so one is enough to keep
#: it fed, and a worker busy at capacity holds at most one unacknowledged
#: message per queue, which the broker gives to others if the worker dies.
PREFETCH_COUNT = 1

#: Longest single wait (s) of a consume loop waiting for room: it re-checks
#: stop() at least this often.
ROOM_WAIT_SLICE_S = 0.5


#: Redis ``visibility_timeout`` (s) workers use unless told otherwise: a
#: request message is unacknowledged only between its receipt and the
#: worker's PENDING reply (milliseconds), so a message still unacknowledged
#: after this long belonged to a worker that died in that window and is given
#: to another worker; kombu's default (an hour) would outlive any transition
#: timeout. Must stay well below the engine's transition_timeout.
REDIS_VISIBILITY_TIMEOUT_S = 20.0


def _is_redis(url: str | None, transport: str | None) -> bool:
    scheme = transport or (url.split("://", 1)[0] if url and "://" in url else "")
    return scheme in ("redis", "rediss")


def _failure_from(error: BaseException) -> ft.Failure:
    """A Failure for an exception created (not raised) here: no traceback to show."""
    return ft.Failure.from_exception(error)


def _attempt_of(headers: Mapping[str, Any]) -> int | None:
    """The ``attempt`` header as an int (None when absent or unusable)."""
    value = headers.get(pr.HEADER_ATTEMPT)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _request_id_of(headers: Mapping[str, Any]) -> str | None:
    value = headers.get(lv.HEADER_REQUEST_ID)
    return value if isinstance(value, str) and value else None


def _pool_size(executor: Any) -> int | None:
    """How many threads/processes ``executor`` runs at once (None: unknown)."""
    size = getattr(executor, "_max_workers", None)
    return size if isinstance(size, int) and size > 0 else None


class _StoredResponse(pr.Message):
    """A reply body remembered from an earlier run, sent again as it was."""

    TYPE = pr.RESPONSE

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def to_dict(self) -> dict[str, Any]:
        return self._body


class Server:
    """Serves task requests for one topic from one exchange, using ``executor``.

    ``heartbeat_interval`` (s) is how often each held request is repeated to
    its executor (advertised in the ``heartbeat`` header); ``capacity`` is
    how many requests may be held at once (default HELD_PER_THREAD per
    thread of ``executor``, unbounded when its size is unknown).
    """

    def __init__(self, topic: str, exchange: str, executor: Any,
                 endpoints: Iterable[endpoint_mod.Endpoint], url: str | None = None,
                 transport: str | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 retry_options: Mapping[str, Any] | None = None,
                 worker_id: str | None = None, events: bool | None = None,
                 task_runner: running_mod.TaskRunner | None = None, *,
                 durable: bool = False, secret: Any = None,
                 heartbeat_interval: float = lv.HEARTBEAT_INTERVAL_S,
                 capacity: int | None = None, compat: str | None = None) -> None:
        self._topic = topic
        self._exchange = exchange
        self._executor = executor
        self._endpoints = {ep.name: ep for ep in endpoints}
        self._tasks = sorted(self._endpoints)
        self._worker_id = worker_id or pr.make_worker_id()
        self._origin = pr.make_origin()
        self._interval = lv.check_interval(heartbeat_interval)
        if capacity is None:
            size = _pool_size(executor)
            capacity = None if size is None else size * HELD_PER_THREAD
        self._capacity = capacity
        self._memory = rm.RequestMemory()
        self._room = threading.Condition()
        self._stopping = threading.Event()
        self._beat_thread: threading.Thread | None = None
        self._beat_wake = threading.Event()
        self._last_announce = time.monotonic()
        self._started_once = False
        # How bodies run: thread or forked child, time limits, shutdown gate.
        self._task_runner = task_runner or running_mod.TaskRunner()
        private_key = pr.worker_routing_key(topic, self._worker_id)
        queues = [
            # compat='taskflow': auto-deleted, as TaskFlow declares it.
            proxy_mod.QueueSpec(pr.topic_queue_name(exchange, topic), (topic,),
                                auto_delete=compat_mod.topic_queue_auto_delete(compat)),
            # The broadcast key reaches every flowengine worker of the topic
            # (a NOTIFY on the topic key reaches only one of them).
            proxy_mod.QueueSpec(pr.worker_queue_name(exchange, topic, self._worker_id),
                                (private_key, lv.broadcast_routing_key(topic)),
                                auto_delete=True),
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
        # A request is acknowledged once this worker answers for it (see
        # _process_request), not on receipt.
        handlers[pr.REQUEST].ack_on_receipt = False
        options = dict(transport_options or {})
        if _is_redis(url, transport):
            options.setdefault("visibility_timeout", REDIS_VISIBILITY_TIMEOUT_S)
        transport_options = options
        self._proxy = proxy_mod.Proxy(topic, exchange, type_handlers=handlers,
                                      on_wait=self._on_wait, url=url, transport=transport,
                                      transport_options=transport_options,
                                      retry_options=retry_options, queues=queues,
                                      wake_routing_key=private_key, on_reject=self._on_reject,
                                      on_start=self._on_start,
                                      prefetch_count=PREFETCH_COUNT,
                                      # durable topology / message signing (H10c)
                                      durable=durable, secret=secret,
                                      compat=compat)  # mixed fleets (H12)
        self._events = event_hooks.WorkerEvents.create(
            exchange, self._worker_id, topic, self._tasks, url=url, transport=transport,
            transport_options=transport_options, enabled=events)

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
    def heartbeat_interval(self) -> float:
        """Seconds between two heartbeats of each held request."""
        return self._interval

    @property
    def capacity(self) -> int | None:
        """How many requests this worker holds at most (None: unbounded)."""
        return self._capacity

    @property
    def memory(self) -> rm.RequestMemory:
        """The requests held and recently finished (duplicate detection)."""
        return self._memory

    @property
    def running_count(self) -> int:
        """How many requests are held (queued here or running) right now."""
        return len(self._memory)

    # --- lifecycle ---

    def start(self) -> None:
        """Serve until stop() (blocks the calling thread)."""
        self._stopping.clear()
        if self._beat_thread is None or not self._beat_thread.is_alive():
            self._beat_thread = threading.Thread(
                target=self._beat_loop, name=f"flowengine-heartbeat-{self._topic}",
                daemon=True)
            self._beat_thread.start()
        self._proxy.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the server consumes; False if ``timeout`` passed first."""
        return self._proxy.wait(timeout)

    def stop(self) -> None:
        """Say goodbye to executors and stop consuming (held requests go on, heartbeating)."""
        self._stopping.set()
        with self._room:
            self._room.notify_all()
        if self._proxy.is_running:
            self._announce(leaving=True)
        self._proxy.stop()
        self._events.offline()

    # --- publishing helpers ---

    def _headers(self, attempt: int | None = None, **extra: Any) -> dict[str, Any]:
        headers = {pr.HEADER_WORKER_ID: self._worker_id, pr.HEADER_ORIGIN: self._origin,
                   lv.HEADER_HEARTBEAT: self._interval}
        if attempt is not None:
            headers[pr.HEADER_ATTEMPT] = attempt
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

    def _reply(self, reply_to: str, task_uuid: str, state: str,
               attempt: int | None = None, **data: Any) -> bool:
        """Publish a Response; False (logged) when it could not be sent."""
        try:
            self._proxy.publish(pr.Response(state, **data), reply_to,
                                correlation_id=task_uuid, headers=self._headers(attempt))
        except Exception:
            LOG.error("Failed to send %s reply for request %s to %s", state, task_uuid,
                      reply_to, exc_info=True)
            return False
        return True

    def _reply_failure(self, reply_to: str, task_uuid: str, error: BaseException,
                       attempt: int | None = None) -> bool:
        """Publish a FAILURE reply describing ``error``."""
        return self._reply(reply_to, task_uuid, pr.FAILURE, attempt,
                           result=_failure_from(error))

    # --- heartbeats ---

    def _beat_loop(self) -> None:
        """Heartbeat every held request and re-announce, until stopped and idle.

        A thread of its own: busy task threads, a consume loop waiting for
        room or a slow broker hop on the request path cannot delay it (short
        of a task holding the GIL in one C call longer than the bound).
        """
        while not (self._stopping.is_set() and len(self._memory) == 0):
            self._beat_wake.wait(self._interval)
            self._beat_wake.clear()
            try:
                self.send_heartbeats()
                if (not self._stopping.is_set()
                        and time.monotonic() - self._last_announce >= ANNOUNCE_PERIOD_S):
                    self._announce()
            except Exception:
                LOG.exception("Heartbeat of worker %s failed; retrying", self._worker_id)

    def send_heartbeats(self) -> int:
        """Repeat PENDING/RUNNING for every held request now; how many were sent."""
        sent = 0
        for held in self._memory.held():
            if held.state == rm.RUNNING or held.announced:
                self._reply(held.reply_to, held.key[0], held.state, held.attempt)
                sent += 1
        return sent

    def running_requests(self) -> list[tuple[tuple[str, str], str, bool]]:
        """Requests taken and not answered yet: ((uuid, action), reply_to, started)."""
        return [(held.key[:2], held.reply_to, held.state == rm.RUNNING)
                for held in self._memory.held()]

    def give_back(self, key: tuple[str, str], error: BaseException) -> bool:
        """Answer held request ``key`` with FAILURE ``error`` (cold shutdown; attempt kept)."""
        for held in self._memory.held():
            if held.key[:2] == key:
                return self._reply_failure(held.reply_to, key[0], error, held.attempt)
        return False

    # --- consume-loop callbacks ---

    def _on_start(self) -> None:
        """Consuming (again): announce ourselves at once (no waiting to be polled)."""
        if not self._started_once:
            self._started_once = True
            LOG.info("Worker %s serves topic %r with %d task(s); heartbeat every %.2f s,"
                     " holds at most %s request(s)", self._worker_id, self._topic,
                     len(self._tasks), self._interval, self._capacity or "unbounded")
        self._announce()
        self._events.online()

    def _on_wait(self) -> None:
        """Periodic work of the consume loop (heartbeats have their own thread)."""
        self._events.heartbeat()

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
        self._reply_failure(reply_to, task_uuid, error, _attempt_of(message.headers or {}))

    def _process_notify(self, data: Any, message: Any) -> None:
        """Answer a NOTIFY request with our topic and tasks (on the consumer thread)."""
        reply_to = message.properties["reply_to"]
        try:
            self._proxy.publish(pr.Notify(topic=self._topic, tasks=self._tasks), reply_to,
                                correlation_id=message.properties.get("correlation_id"),
                                headers=self._headers())
        except Exception:
            LOG.warning("Failed to answer NOTIFY from %s", reply_to, exc_info=True)

    def _drop_expired(self, reply_to: str, task_uuid: str, task_name: Any,
                      expires: float, attempt: int | None, data: Any,
                      headers: Mapping[str, Any]) -> None:
        """Say (log + FAILURE reply) that a request past its ``expires`` is dropped unrun."""
        late = time.time() - expires
        LOG.info("Dropped request %s for task %r unrun: it expired %.3f s ago and nobody"
                 " waits for it any more", task_uuid, task_name, late)
        self._events.expired(task_uuid, data, headers)
        # Its executor has normally given up already and ignores this reply;
        # one whose clock runs behind ours learns the outcome sooner.
        self._reply_failure(reply_to, task_uuid, exc.RequestExpired(
            f"Worker {self._worker_id} dropped request {task_uuid} for task {task_name!r}"
            f" unrun: it expired {late:.3f} s before it could start"), attempt)

    def _process_request(self, data: dict[str, Any], message: Any) -> None:
        """Check a validated request and hand it to the executor; never raises."""
        props = message.properties
        reply_to, task_uuid = props["reply_to"], props["correlation_id"]
        headers = message.headers or {}
        compat_mod.note_request(headers, reply_to, self._worker_id, task_uuid)
        attempt = _attempt_of(headers)
        try:
            expires = pr.parse_expires(headers.get(pr.HEADER_EXPIRES))
        except exc.InvalidFormat as e:
            self._reply_failure(reply_to, task_uuid, e, attempt)
            return
        if expires is not None and time.time() > expires:
            self._drop_expired(reply_to, task_uuid, data.get("task_name"), expires, attempt,
                               data, headers)
            return
        try:
            work = pr.Request.from_dict(data, task_uuid=task_uuid)
        except Exception as e:
            self._reply_failure(reply_to, task_uuid, exc.InvalidFormat(
                f"Request {task_uuid} could not be decoded: {e}", cause=e), attempt)
            return
        endpoint = self._endpoints.get(work.task_cls)
        if endpoint is None:
            LOG.warning("Request %s names task class %r, which worker %s does not serve",
                        task_uuid, work.task_cls, self._worker_id)
            self._reply_failure(reply_to, task_uuid, exc.UnknownTask(
                f"Worker {self._worker_id} (topic {self._topic!r}) has no task class"
                f" {work.task_cls!r}; it serves {self._tasks}"), attempt)
            return
        key = (task_uuid, work.action, _request_id_of(headers))
        # PENDING replies/heartbeats only to flowengine executors (they send
        # 'attempt'); TaskFlow's would log each one as unexpected.
        verdict = self._memory.admit(key, reply_to, attempt, expires,
                                     announced=attempt is not None)
        if verdict.kind != rm.NEW:
            self._answer_duplicate(verdict, reply_to, task_uuid, work, attempt)
            return
        try:
            task = endpoint.generate(name=work.task_name)
        except Exception as e:
            self._finished(key, None)
            LOG.warning("Could not create task %r of class %s", work.task_name,
                        work.task_cls, exc_info=True)
            self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
                f"Worker {self._worker_id} could not create task {work.task_name!r} of"
                f" class {work.task_cls}: {e}", cause=e), attempt)
            return
        self._events.received(task_uuid, work, headers)
        if attempt is not None:
            # From now on this worker answers for the request: its executor
            # knows who holds it and hears its heartbeats while it waits here.
            self._reply(reply_to, task_uuid, pr.PENDING, attempt)
        # Only now is the message acknowledged: had we died before this, the
        # broker would give it to another worker (AMQP at once, Redis after
        # its visibility timeout), and nobody had been told we hold it.
        message.ack_log_error(LOG, (Exception,))
        try:
            self._executor.submit(self._run, endpoint, task, work, key, headers)
        except Exception as e:
            self._finished(key, None)
            self._events.forget(task_uuid)
            self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
                f"Worker {self._worker_id} could not schedule request {task_uuid}: {e}",
                cause=e), attempt)
            return
        self._wait_for_room()

    def _answer_duplicate(self, verdict: rm.Verdict, reply_to: str, task_uuid: str,
                          work: pr.WorkUnit, attempt: int | None) -> None:
        """Answer a request already held or finished here from memory (never run it again)."""
        what = f"{work.action} of {work.task_name!r}"
        if verdict.kind == rm.STALE:
            LOG.warning("Ignored request %s (%s), attempt %s: attempt %s of it is already"
                        " held here", task_uuid, what, attempt, verdict.held.attempt)
            return
        if verdict.kind == rm.HELD:
            held = verdict.held
            LOG.warning("Duplicate of request %s (%s, attempt %s): it is already %s here;"
                        " answering with its state, not running it again", task_uuid, what,
                        attempt, "running" if held.state == rm.RUNNING else "queued")
            if held.state == rm.RUNNING or attempt is not None:
                self._reply(reply_to, task_uuid, held.state, held.attempt)
            return
        done = verdict.finished
        LOG.warning("Duplicate of request %s (%s, attempt %s): it finished here %.1f s ago;"
                    " sending its outcome again, not running it again", task_uuid, what,
                    attempt, time.monotonic() - done.finished_at)
        if done.outcome is not None:
            try:
                self._proxy.publish(_StoredResponse(done.outcome), reply_to,
                                    correlation_id=task_uuid, headers=self._headers(attempt))
            except Exception:
                LOG.error("Failed to send the remembered outcome of request %s to %s",
                          task_uuid, reply_to, exc_info=True)
            return
        self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
            f"Request {task_uuid} ({what}) already ran on worker {self._worker_id}; its"
            f" outcome ({done.outcome_bytes} bytes) was too large to keep for duplicates"),
            attempt)

    def _wait_for_room(self) -> None:
        """Block the consume loop while more than ``capacity`` requests are held.

        So at most capacity + 1 are held (the last one taken before the loop
        noticed); NOTIFY requests wait meanwhile, but the heartbeat thread
        keeps announcing this worker. Returns at once on stop().
        """
        if self._capacity is None:
            return
        with self._room:
            while len(self._memory) > self._capacity and not self._stopping.is_set():
                self._room.wait(ROOM_WAIT_SLICE_S)

    def _finished(self, key: rm.Key, outcome: dict[str, Any] | None) -> None:
        """A held request is answered (or given up): remember it, make room."""
        if outcome is None:
            self._memory.forget(key)
        else:
            self._memory.finish(key, outcome)
        with self._room:
            self._room.notify_all()

    # --- executor side ---

    def _run(self, endpoint: endpoint_mod.Endpoint, task: Any, work: pr.WorkUnit,
             key: rm.Key, headers: Any = None) -> None:
        """Run one request on an executor thread and send its replies."""
        task_uuid = key[0]
        held = self._memory.start(key)
        if held is None:  # pragma: no cover - admitted before submit
            return
        outcome: dict[str, Any] | None = None
        try:
            if held.expires is not None and time.time() > held.expires:
                # Waited here for a thread past the time its executor gave up.
                self._drop_expired(held.reply_to, task_uuid, work.task_name, held.expires,
                                   held.attempt, {"task_name": work.task_name}, headers or {})
                return
            if not self._reply(held.reply_to, task_uuid, pr.RUNNING, held.attempt):
                LOG.error("Request %s for task %r not run: its RUNNING reply could not"
                          " be sent", task_uuid, work.task_name)
                return
            self._events.started(task_uuid)
            started = time.monotonic()
            progress = functools.partial(self._on_event, held, task_uuid)
            ctx = context_mod.RequestContext(task_uuid, work.action, held.attempt or 0,
                                             key[2], self._worker_id)
            with context_mod.running(ctx):
                result = self._task_runner.run(endpoint, task, work, progress, headers,
                                               key[:2])
            elapsed = time.monotonic() - started
            state = pr.FAILURE if isinstance(result, ft.Failure) else pr.SUCCESS
            outcome = self._send_outcome(held, task_uuid, work, state, result)
            self._events.finished(task_uuid, state == pr.SUCCESS, result)
            LOG.info("Task %r (%s) %s for request %s finished in %.3f s: %s",
                     work.task_name, work.task_cls, work.action, task_uuid, elapsed, state)
        except Exception:
            LOG.exception("Unexpected error running request %s", task_uuid)
        finally:
            self._finished(key, outcome)

    def _send_outcome(self, held: rm.Held, task_uuid: str, work: pr.WorkUnit, state: str,
                      result: Any) -> dict[str, Any] | None:
        """Publish SUCCESS/FAILURE; return the body sent (None if nothing was sent).

        An unencodable outcome becomes a FAILURE naming why.
        """
        response = pr.Response(state, result=result)
        try:
            body = response.to_dict()
            self._proxy.publish(_StoredResponse(body), held.reply_to,
                                correlation_id=task_uuid, headers=self._headers(held.attempt))
            return body
        except exc.SerializationFailure as e:
            what = "result" if state == pr.SUCCESS else "failure"
            error = exc.SerializationFailure(
                f"The {what} of task {work.task_name!r} ({work.task_cls}, {work.action})"
                f" cannot be sent as JSON: {e.cause or e}")
            LOG.warning("Request %s: %s", task_uuid, error.args[0])
        except Exception:
            LOG.error("Failed to send %s reply for request %s to %s", state, task_uuid,
                      held.reply_to, exc_info=True)
            return None
        body = pr.Response(pr.FAILURE, result=_failure_from(error)).to_dict()
        try:
            self._proxy.publish(_StoredResponse(body), held.reply_to,
                                correlation_id=task_uuid, headers=self._headers(held.attempt))
        except Exception:
            LOG.error("Failed to send FAILURE reply for request %s to %s", task_uuid,
                      held.reply_to, exc_info=True)
            return None
        return body

    def _on_event(self, held: rm.Held, task_uuid: str, event_type: str,
                  details: dict[str, Any]) -> None:
        """Forward a task notification (progress) to the executor as an EVENT."""
        self._events.progress(task_uuid, event_type, details)
        try:
            self._proxy.publish(pr.Response(pr.EVENT, event_type=event_type,
                                            details=dict(details or {})),
                                held.reply_to, correlation_id=task_uuid,
                                headers=self._headers(held.attempt))
        except Exception:
            LOG.warning("Failed to send %s event for request %s", event_type, task_uuid,
                        exc_info=True)
