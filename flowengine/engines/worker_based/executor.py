"""The executor side of the worker-based engine: publish requests, follow replies.

The request path never waits on a timer: a request is published as soon as a
capable worker is known (else it waits and is published the moment one is
discovered) and each reply is handled as it arrives, in whatever order. A
separate housekeeping thread does the periodic work beside that path:
expiring requests nobody started, noticing workers that died while running
one, refreshing discovery and forgetting silent workers.
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

import kombu
from kombu.transport import virtual

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import compat as compat_mod
from flowengine.engines.worker_based import dispatcher, events, remote_stats, topology, transports
from flowengine.engines.worker_based import liveness as lv
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import proxy as px
from flowengine.engines.worker_based import timelimits as tlim
from flowengine.engines.worker_based import tracking as tr
from flowengine.engines.worker_based import types as wt
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

# Seconds a request may stay WAITING (no capable worker known) or PENDING
# (published, not yet started) before it fails with RequestTimeout; TaskFlow's
# default, long enough for a worker to start and announce itself.
REQUEST_TIMEOUT_S = pr.REQUEST_TIMEOUT_S

# Heartbeats a held request may miss before it is lost with its worker, and
# how many dispatches one request gets in total (see liveness.py for why).
HEARTBEAT_MISSES = lv.HEARTBEAT_MISSES
MAX_ATTEMPTS = lv.MAX_ATTEMPTS

# Seconds between two rounds of the reply consumer's loop when no reply
# arrives. A request is only declared lost once the consumer has gone round
# after its deadline, so an executor whose own threads were starved (a busy
# process, a paused VM) never blames a worker for replies it had not read
# yet; short, because it adds to the detection time.
CONSUMER_TICK_S = 0.1

# Lost requests remembered in ``lost_history`` (diagnostics, tests).
LOST_HISTORY_MAX = 1000

# Executor options (engine options of the same names) for liveness; see
# WorkerTaskExecutor and doc/source/reliability.rst.
LIVENESS_OPTIONS = ("heartbeat_interval", "heartbeat_misses", "lost_after", "max_attempts",
                    "run_timeout")


def liveness_options(options: Any) -> dict[str, Any]:
    """The liveness options present in engine ``options`` (to pass to the executor)."""
    return {name: options[name] for name in LIVENESS_OPTIONS if name in options}


class LostRecord(collections.namedtuple(
        "LostRecord", "request_uuid worker_id attempt silent_s detected_at")):
    """One request found lost: whose worker, which attempt, after how long a silence."""

# Upper bound, in seconds, on how long the housekeeping thread sleeps when it
# has nothing scheduled: it wakes early on any new deadline, so this only
# bounds how late a stop() or a clock jump is noticed.
HOUSEKEEPING_MAX_SLEEP_S = 5.0

# Seconds to wait for the reply consumer to be ready in start(): a broker that
# takes longer than this is reported instead of hanging the engine.
START_TIMEOUT_S = 30.0

# Seconds stop() waits for each helper thread to finish before giving up on it
# (they are daemons, so a stuck broker call cannot keep the process alive).
STOP_JOIN_TIMEOUT_S = 10.0

_ORIGIN = pr.make_origin()
_STOP = object()


class WorkerTaskExecutor(base.TaskExecutor):
    """Executes tasks on remote workers."""

    def __init__(self, uuid: str, exchange: str, topics: Iterable[str],
                 transition_timeout: float | None = REQUEST_TIMEOUT_S,
                 url: str | None = None, transport: str | None = None,
                 transport_options: dict | None = None, retry_options: dict | None = None,
                 worker_expiry: float | None = wt.WORKER_EXPIRY_S, *,
                 root_id: str | None = None, parent_id: str | None = None,
                 durable: bool = False, secret: Any = None,
                 compat: str | None = None,
                 heartbeat_interval: float = lv.HEARTBEAT_INTERVAL_S,
                 heartbeat_misses: int = HEARTBEAT_MISSES, lost_after: float | None = None,
                 max_attempts: int = MAX_ATTEMPTS,
                 run_timeout: float | None = None) -> None:
        self._uuid = uuid
        self._compat = compat  # mixed fleets with TaskFlow (H12): compat.py
        self._exchange = exchange
        self._conn_args = (url, transport, dict(transport_options or {}))
        self._transition_timeout = transition_timeout
        self._root_id = root_id
        self._parent_id = parent_id
        # Liveness: a held request is lost after its worker's advertised
        # heartbeat interval (heartbeat_interval when it advertises none) x
        # heartbeat_misses of silence, or after lost_after when given.
        self._heartbeat_interval = lv.check_interval(heartbeat_interval)
        if int(heartbeat_misses) < 1:
            raise ValueError(f"heartbeat_misses must be >= 1 (got {heartbeat_misses!r})")
        self._heartbeat_misses = int(heartbeat_misses)
        self._lost_after_s = (None if lost_after is None
                              else lv.check_interval(lost_after, "lost_after"))
        if int(max_attempts) < 1:
            raise ValueError(f"max_attempts must be >= 1 (got {max_attempts!r})")
        self._max_attempts = int(max_attempts)
        if run_timeout is not None and not run_timeout > 0:
            raise ValueError(f"run_timeout must be > 0 seconds or None (got {run_timeout!r})")
        self._run_timeout = run_timeout
        #: The latest requests found lost (oldest first).
        self.lost_history: collections.deque[LostRecord] = collections.deque(
            maxlen=LOST_HISTORY_MAX)
        # worker id -> when we last asked it privately who it is.
        self._probed: dict[str, float] = {}
        handlers = {
            pr.NOTIFY: dispatcher.Handler(
                self._process_notify,
                validator=functools.partial(pr.Notify.validate, response=True)),
            pr.RESPONSE: dispatcher.Handler(
                self._process_response, validator=pr.Response.validate,
                required_properties=("correlation_id",)),
        }
        # Our reply queue also receives every worker's announcements, so a
        # worker that starts after us is known the moment it is up.
        self._proxy = px.Proxy(uuid, exchange, type_handlers=handlers, url=url,
                               transport=transport, transport_options=transport_options,
                               retry_options=retry_options,
                               bindings=[pr.ANNOUNCE_ROUTING_KEY],
                               # durable topology / message signing (H10c)
                               durable=durable, secret=secret, compat=compat,
                               on_wait=self._on_consumer_tick,
                               on_wait_period_s=CONSUMER_TICK_S)
        # Monotonic time the reply consumer last went round its loop.
        self._consumer_tick = time.monotonic()
        beat = wt.NOTIFY_PERIOD_S
        if worker_expiry is not None and worker_expiry > 0:
            # Three beats per expiry period: a worker must miss three NOTIFY
            # requests in a row before it is forgotten.
            beat = min(beat, worker_expiry / 3.0)
        self._finder = wt.ProxyWorkerFinder(uuid, self._proxy, topics,
                                            beat_periodicity=beat,
                                            worker_expiry=worker_expiry,
                                            on_change=self._on_workers_changed)
        self._book = tr.RequestBook(self._finder, transition_timeout)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._releases: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        #: Queue/run times and attempts of each remote atom (engine statistics).
        self.remote_statistics = remote_stats.RemoteStatistics()

    # -- public API ---------------------------------------------------------

    @property
    def uuid(self) -> str:
        """The executor's id: its reply queue's routing key."""
        return self._uuid

    @property
    def finder(self) -> wt.ProxyWorkerFinder:
        """The worker finder (discovery state) this executor routes with."""
        return self._finder

    def execute_task(self, task: Any, task_uuid: str, arguments: dict,
                     progress_callback: Callable | None = None) -> futures.Future:
        """Schedule the task's execution on a worker; the future never raises."""
        return self._submit_task(task, task_uuid, pr.EXECUTE, arguments, progress_callback)

    def revert_task(self, task: Any, task_uuid: str, arguments: dict, result: Any,
                    failures: dict, progress_callback: Callable | None = None
                    ) -> futures.Future:
        """Schedule the task's revert on a worker (result/failures sent as dicts)."""
        return self._submit_task(task, task_uuid, pr.REVERT, arguments, progress_callback,
                                 result=result, failures=failures)

    def wait_for_workers(self, workers: int = 1, timeout: float | None = None) -> int:
        """Wait for at least ``workers`` workers; return how many are still missing."""
        return self._finder.wait_for_workers(workers=workers, timeout=timeout)

    def set_trace_ids(self, root_id: str | None, parent_id: str | None) -> None:
        """Set the root/parent ids carried in request headers (for tracing)."""
        self._root_id = root_id
        self._parent_id = parent_id

    def start(self) -> None:
        """Start consuming replies and announcements, then ask every topic who is there.

        Raises ExecutionFailure when the broker cannot be consumed from within
        START_TIMEOUT_S.
        """
        if self._threads:
            return
        self._stopping.clear()
        self._wake.clear()
        self._spawn(self._consume, "replies")
        if not self._proxy.wait(START_TIMEOUT_S):
            self.stop()
            raise exc.ExecutionFailure(
                f"Could not start consuming replies on exchange {self._exchange!r}"
                f" within {START_TIMEOUT_S} s")
        self._spawn(self._release_loop, "release")
        self._spawn(self._housekeeping_loop, "housekeeping")
        try:
            self._finder.publish()
        except Exception:
            LOG.warning("Failed to send NOTIFY to topics %s; will retry in the next beat",
                        self._finder.topics, exc_info=True)

    def stop(self) -> None:
        """Stop the helper threads and the consumer; fail requests still in flight."""
        self._stopping.set()
        self._wake.set()
        self._releases.put(_STOP)
        try:
            self._proxy.stop()
        except Exception:
            LOG.warning("Failed to stop the reply consumer", exc_info=True)
        started = bool(self._threads)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(STOP_JOIN_TIMEOUT_S)
        self._threads = []
        if started:
            self._drop_reply_queue()
        while True:  # whatever the release thread did not consume
            try:
                self._releases.get_nowait()
            except queue.Empty:
                break
        leftovers = self._book.drain()
        if leftovers:
            LOG.warning("Executor %s stopped with %d requests unfinished; they fail",
                        self._uuid, len(leftovers))
        for tracked in leftovers:
            self._fail(tracked, exc.ExecutionFailure(
                f"Executor {self._uuid} stopped before request {tracked.request} finished"),
                log=False)

    def _drop_reply_queue(self) -> None:
        """Unbind and empty our reply queue once nobody consumes it.

        kombu's virtual transports (filesystem, redis, memory) ignore
        auto_delete: left bound, the queue would collect every worker's
        announcements forever (one more dead queue per engine run).
        """
        url, transport, options = self._conn_args
        if url is None:
            url = f"{transport}://" if transport and transport.isidentifier() else "localhost"
        # Declared as the proxy declares them (a durable mismatch would fail).
        exchange = compat_mod.make_exchange(self._exchange, durable=self._proxy.durable,
                                            compat=self._compat)
        keys = (self._uuid, pr.ANNOUNCE_ROUTING_KEY)
        queue = topology.make_queue(pr.reply_queue_name(self._exchange, self._uuid), exchange,
                                    keys, auto_delete=True, durable=self._proxy.durable)
        try:
            with kombu.Connection(url, transport=transports.resolve(url, transport),
                                  transport_options=options) as conn:
                conn.ensure_connection(max_retries=1)
                bound = queue(conn.default_channel)
                # Declared again so this connection knows the bindings to remove.
                bound.declare()
                bound.delete()
                if isinstance(conn.default_channel, virtual.Channel):
                    bound.purge()
        except Exception:
            LOG.debug("Could not remove reply queue of executor %s", self._uuid,
                      exc_info=True)

    # -- request path -------------------------------------------------------

    def _submit_task(self, task: Any, task_uuid: str, action: str, arguments: dict,
                     progress_callback: Callable | None, **kwargs: Any) -> futures.Future:
        """Create the request and publish it now if a capable worker is known."""
        timeout = self._transition_timeout
        request = pr.Request(task, task_uuid, action, arguments, timeout=timeout, **kwargs)
        deadline = None if timeout is None else request.created_on + timeout
        tracked = tr.Tracked(request, progress_callback, deadline)
        tracked.request_id = uuidlib.uuid4().hex
        route, wake = self._book.submit(tracked)
        if wake:
            self._wake.set()
        if route is not None:
            self._publish_request(tracked)
        return request.future

    def _headers_for(self, tracked: tr.Tracked) -> dict[str, Any]:
        """The flowengine headers that travel with a request."""
        headers: dict[str, Any] = {pr.HEADER_ATTEMPT: tracked.attempt,
                                   pr.HEADER_ORIGIN: _ORIGIN}
        if tracked.request_id is not None:
            headers[lv.HEADER_REQUEST_ID] = tracked.request_id
        if tracked.deadline is not None:
            # Nobody waits for an unstarted request after its transition
            # timeout: a worker that would start it later drops it unrun
            # (expires is a little earlier than our deadline; see liveness.py).
            headers[pr.HEADER_EXPIRES] = lv.expires_at(tracked.deadline,
                                                       self._transition_timeout or 0.0)
        headers.update(events.timing_headers(tracked.origin.created_at))
        limits = tlim.header_for(tracked.request.task)  # the task's soft/hard limits
        if limits is not None:
            headers[pr.HEADER_TIMELIMIT] = limits
        if self._root_id is not None:
            headers[pr.HEADER_ROOT_ID] = self._root_id
        if self._parent_id is not None:
            headers[pr.HEADER_PARENT_ID] = self._parent_id
        return headers

    def _publish_request(self, tracked: tr.Tracked) -> None:
        """Publish one PENDING request to its routing key; fail it if that fails."""
        request = tracked.request
        try:
            self._proxy.publish(request, tracked.routing_key, reply_to=self._uuid,
                                correlation_id=request.uuid,
                                headers=self._headers_for(tracked))
        except Exception as e:
            LOG.error("Failed to publish request %s to %r: %s", request,
                      tracked.routing_key, e, exc_info=True)
            failure = ft.Failure()
            with self._book.lock:
                if not self._book.is_current(tracked) or tracked.request is not request:
                    return
                self._book.remove(tracked)
                tr.transition(tracked, pr.FAILURE)
            tracked.resolve(failure)

    def _fail(self, tracked: tr.Tracked, error: exc.FlowEngineError, log: bool = True) -> None:
        """Resolve a request with ``error`` as its failure (logged unless told not to)."""
        try:
            raise error
        except exc.FlowEngineError:
            if log:
                LOG.warning("%s", error)
            tracked.resolve(ft.Failure())

    # -- replies ------------------------------------------------------------

    def _process_notify(self, data: dict, message: Any) -> None:
        """A worker answered NOTIFY or announced itself (or is leaving)."""
        worker = self._finder.process_response(data, message)
        if worker is not None and worker.topic not in self._finder.topics:
            # Learned by listening: keep the new topic in the NOTIFY beat so
            # the worker's liveness keeps being refreshed.
            self._finder.add_topic(worker.topic)

    def _on_workers_changed(self) -> None:
        """New or changed worker: hand waiting requests to the release thread."""
        # Always (not only when something waits right now): a request being
        # submitted concurrently may join the waiting list just after a check.
        self._releases.put(True)

    def _process_response(self, data: dict, message: Any) -> None:
        """A reply for one of our requests: PENDING, RUNNING, EVENT, SUCCESS or FAILURE."""
        request_uuid = message.properties.get("correlation_id")
        tracked = self._book.get(request_uuid)
        if tracked is None:
            LOG.debug("Ignoring response for request %s: not waiting for it"
                      " (finished, timed out or someone else's)", request_uuid)
            return
        response = pr.Response.from_dict(data)
        state = response.state
        headers = message.headers or {}
        attempt = headers.get(pr.HEADER_ATTEMPT)
        if (isinstance(attempt, int) and not isinstance(attempt, bool)
                and attempt != tracked.attempt):
            # Fencing: a worker still answering for a dispatch we replaced
            # (it was declared lost) must not complete or refresh the new one.
            LOG.info("Ignored %s reply for request %s from worker %s: it is for attempt %d,"
                     " superseded by attempt %d", state, request_uuid,
                     headers.get(pr.HEADER_WORKER_ID), attempt, tracked.attempt)
            return
        worker_id = headers.get(pr.HEADER_WORKER_ID)
        if worker_id is not None:
            worker_id = str(worker_id)
            self._maybe_probe(tracked, worker_id)
        else:
            compat_mod.note_reply(message.headers, self._uuid, tracked.topic, tracked.request)
        if state in (pr.PENDING, pr.RUNNING):
            lost_after = self._lost_after_for(headers)
            with self._book.lock:
                wake = False
                if self._book.is_current(tracked) and (
                        state == pr.PENDING or tr.transition(tracked, pr.RUNNING)):
                    wake = self._book.heard(tracked, worker_id, lost_after)
                    if tracked.request.current_state == pr.RUNNING:
                        wake = self._book.limit_run(tracked, self._run_timeout) or wake
            if wake:
                self._wake.set()
        elif state == pr.EVENT:
            if tracked.worker_id is not None:
                tracked.last_heard = time.monotonic()
            self._on_event(tracked, response.data)
        elif state in (pr.SUCCESS, pr.FAILURE):
            self._complete(tracked, state, response.data.get("result"), worker_id)
        else:
            LOG.warning("Ignoring response for request %s in unexpected state %r",
                        request_uuid, state)

    def _on_consumer_tick(self) -> None:
        """The reply consumer went round its loop (replies read so far are handled)."""
        self._consumer_tick = time.monotonic()

    def _lost_after_for(self, headers: Any) -> float:
        """Seconds of silence after which a request held by this reply's worker is lost."""
        if self._lost_after_s is not None:
            return self._lost_after_s
        interval = lv.parse_heartbeat(headers.get(lv.HEADER_HEARTBEAT))
        return lv.lost_after(interval or self._heartbeat_interval, self._heartbeat_misses)

    def _complete(self, tracked: tr.Tracked, state: str, result: Any,
                  worker_id: str | None) -> None:
        """SUCCESS or FAILURE arrived: resolve the engine's future (exactly once)."""
        with self._book.lock:
            if not self._book.is_current(tracked):
                return
            if state == pr.SUCCESS:
                # A SUCCESS may overtake its RUNNING (e.g. on the filesystem
                # transport): pass through RUNNING first.
                tr.transition(tracked, pr.RUNNING)
            elif worker_id is not None and self._refused_as_unknown(tracked, result):
                return
            elif self._given_back(tracked, result):
                return
            if not tr.transition(tracked, state):
                return
            self._book.remove(tracked)
        self.remote_statistics.record(tracked)
        tracked.resolve(result)

    def _on_event(self, tracked: tr.Tracked, data: dict) -> None:
        """Forward a task event (progress) to the engine and the task's own notifier."""
        event_type, details = data["event_type"], data["details"]
        callback = tracked.progress_callback
        if callback is not None:
            try:
                callback(event_type, details)
            except Exception:
                LOG.warning("Progress callback failed for request %s", tracked.request,
                            exc_info=True)
        # As TaskFlow does, listeners on the engine-side task object hear the
        # worker's events too, so the same code works locally and remotely.
        notifier = getattr(tracked.request.task, "notifier", None)
        if notifier is not None and notifier.can_trigger_notification(event_type):
            notifier.notify(event_type, dict(details))

    def _maybe_probe(self, tracked: tr.Tracked, worker_id: str) -> None:
        """A reply from a worker we do not know: ask it (privately) who it is.

        A NOTIFY sent to a topic reaches one of the workers sharing it, so
        others are only learned from their announcements; this closes the gap
        as soon as one of them answers a request.
        """
        topic = tracked.topic
        if topic is None or self._finder.has_worker(worker_id):
            return
        now = time.monotonic()
        with self._book.lock:
            last = self._probed.get(worker_id)
            if last is not None and now - last < wt.NOTIFY_PERIOD_S:
                return
            self._probed[worker_id] = now
        try:
            self._proxy.publish(pr.Notify(), pr.worker_routing_key(topic, worker_id),
                                reply_to=self._uuid)
        except Exception:
            LOG.warning("Failed to send NOTIFY to worker %s", worker_id, exc_info=True)

    def _given_back(self, tracked: tr.Tracked, result: Any) -> bool:
        """A worker in a cold shutdown gave the request back: dispatch it again (lock held).

        The worker killed (process executor) or abandoned (exiting) the body
        before replying WorkerShutdown, so the next attempt never overlaps it.
        """
        if (not isinstance(result, ft.Failure) or not result.check(exc.WorkerShutdown)
                or tracked.attempt + 1 >= self._max_attempts):
            return False
        LOG.warning("Request %s was given back by its worker, which is shutting down;"
                    " dispatching it again (attempt %d of %d)", tracked.request,
                    tracked.attempt + 2, self._max_attempts)
        self._book.new_attempt(tracked, route_now=False)
        self._releases.put(True)  # the release thread routes it to another worker
        return True

    def _refused_as_unknown(self, tracked: tr.Tracked, result: Any) -> bool:
        """Re-route a request that a not-yet-known worker refused (lock held).

        Happens when a topic is shared by workers we had not all heard from:
        the request waits until that worker's answer to our probe updates the
        routes, then goes to one that can run it (within MAX_ATTEMPTS).
        """
        if (not isinstance(result, ft.Failure) or not result.check(exc.UnknownTask)
                or tracked.routing_key != tracked.topic
                or tracked.attempt + 1 >= self._max_attempts):
            return False
        LOG.warning("A worker on topic %r cannot run %s; routing request %s again once"
                    " its task list is known", tracked.topic,
                    wt.task_class_name(tracked.request.task), tracked.request)
        _, wake = self._book.new_attempt(tracked, route_now=False)
        if wake:
            self._wake.set()
        return True

    # -- helper threads -----------------------------------------------------

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"wbe-{name}-{self._uuid}",
                                  daemon=True)
        thread.start()
        self._threads.append(thread)

    def _consume(self) -> None:
        """Run the proxy's message loop (it supervises its own handlers)."""
        try:
            self._proxy.start()
        except Exception:
            LOG.exception("Reply consumer of executor %s died; requests in flight will"
                          " time out or be failed on stop()", self._uuid)

    def _release_loop(self) -> None:
        """Publish waiting requests as soon as a capable worker appears."""
        while True:
            item = self._releases.get()
            if item is _STOP or self._stopping.is_set():
                return
            try:
                for tracked in self._book.release_waiting():
                    self._publish_request(tracked)
            except Exception:
                LOG.exception("Failed to release waiting requests")

    def _housekeeping_loop(self) -> None:
        """Expire requests, recover lost ones, refresh discovery, forget silent workers."""
        while not self._stopping.is_set():
            sleep_s = HOUSEKEEPING_MAX_SLEEP_S
            try:
                now = time.monotonic()
                expired, lost, overrun = self._book.scan(now)
                for tracked in expired:
                    self._fail(tracked, self._timeout_error(tracked))
                for tracked in overrun:
                    self._fail(tracked, exc.RequestTimeout(
                        f"Request '{tracked.request}' ran on worker {tracked.worker_id} for"
                        f" longer than its run_timeout of {self._run_timeout} s; it is"
                        f" failed (the worker may still finish it; its reply is ignored)"))
                for tracked in lost:
                    self._recover_lost(tracked, now)
                next_deadline = self._book.next_deadline
                if next_deadline is not None:
                    sleep_s = min(sleep_s, max(0.0, next_deadline - time.monotonic()))
                self._finder.clean()
                self._finder.maybe_publish()
                beat = self._finder.seconds_to_next_beat()
                if beat is not None:
                    sleep_s = min(sleep_s, beat)
            except Exception:
                LOG.warning("Housekeeping of executor %s failed; retrying", self._uuid,
                            exc_info=True)
            self._wake.wait(sleep_s)
            self._wake.clear()

    def _timeout_error(self, tracked: tr.Tracked) -> exc.RequestTimeout:
        """RequestTimeout with a message saying what it means for the user."""
        waited = self._transition_timeout or 0.0
        where = ("no worker that can run it was found" if tracked.routing_key is None
                 else f"no worker on {tracked.routing_key!r} started it")
        return exc.RequestTimeout(
            f"Request '{tracked.request}' has expired after waiting for {waited:0.2f}"
            f" seconds for it to transition out of ({', '.join(tr.TIMEOUT_STATES)})"
            f" states: {where}")

    def _recover_lost(self, tracked: tr.Tracked, now: float) -> None:
        """A held request's worker went silent: dispatch it again elsewhere, or give up.

        The silent worker is forgotten first, so the next attempt goes to
        another capable worker (it is learned again if it speaks up).
        """
        worker_id = tracked.worker_id
        silent = now - (tracked.last_heard or now)
        route = None
        with self._book.lock:
            request = tracked.request
            if (not self._book.is_current(tracked)
                    or request.current_state not in (pr.PENDING, pr.RUNNING)
                    or tracked.last_heard is None or tracked.lost_after is None
                    or tracked.last_heard + tracked.lost_after > now):
                return  # finished, or heard from again meanwhile
            if self._consumer_tick < tracked.last_heard + tracked.lost_after:
                # Our consumer has not caught up since the deadline: look again
                # once it has (its replies may be waiting for us, not lost).
                self._book.recheck(now + CONSUMER_TICK_S)
                return
            # Forgotten before the next route is picked (lock order: book,
            # then finder, as everywhere): the next attempt goes elsewhere.
            if worker_id is not None and self._finder.forget_worker(worker_id):
                LOG.warning("Forgot worker %s: no heartbeat for %.1f s while holding"
                            " request %s", worker_id, silent, request)
            allowed = tracked.lost_after
            self.lost_history.append(LostRecord(tracked.uuid, worker_id, tracked.attempt,
                                                silent, now))
            give_up = tracked.attempt + 1 >= self._max_attempts
            if give_up:
                if tr.transition(tracked, pr.FAILURE):
                    self._book.remove(tracked)
                else:
                    return
            else:
                route, _ = self._book.new_attempt(tracked)
        if give_up:
            self._fail(tracked, exc.RequestLost(
                f"Request '{request}' was lost: worker {worker_id} stopped answering"
                f" ({silent:.1f} s without a heartbeat, allowed {allowed:.1f} s)"
                f" and the request was already dispatched {tracked.attempt + 1} time(s)"
                f" (max_attempts={self._max_attempts}); its task may or may not have run"))
            return
        LOG.warning("Request %s was lost with worker %s (%.1f s without a heartbeat, allowed"
                    " %.1f s); dispatching it again as attempt %d (dispatch %d of at most %d)",
                    request, worker_id, silent, allowed, tracked.attempt,
                    tracked.attempt + 1, self._max_attempts)
        if route is not None:
            self._publish_request(tracked)
