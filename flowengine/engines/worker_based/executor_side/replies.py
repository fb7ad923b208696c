"""The executor's reply handling: what workers say about our requests and themselves.

Each reply is handled as it arrives, in whatever order, in the reply
consumer's thread (WorkerTaskExecutor mixes this in): announcements and
NOTIFY answers update discovery; PENDING/RUNNING/EVENT replies refresh a
request's liveness; SUCCESS/FAILURE resolve the engine's future exactly once.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from typing import Any

from flowengine import exceptions as exc
from flowengine import task as task_mod
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import discovery as wt
from flowengine.engines.worker_based.executor_side import remote_stats
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.messaging import compat as compat_mod
from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)


class ReplyHandling:
    """Handlers for the messages on an executor's reply queue (a mixin).

    Expects the attributes annotated below from the class it is mixed into.
    """

    _uuid: str
    _book: tr.RequestBook
    _finder: wt.ProxyWorkerFinder
    _proxy: px.Proxy
    _lost_after_s: float | None
    _heartbeat_interval: float
    _heartbeat_misses: int
    _max_attempts: int
    _run_timeout: float | None
    _wake: threading.Event
    _releases: queue.SimpleQueue
    _probed: dict[str, float]
    remote_statistics: remote_stats.RemoteStatistics

    def _reply_handlers(self) -> dict[str, dispatcher.Handler]:
        """The reply queue's handlers by message type, with their validators."""
        return {
            pr.NOTIFY: dispatcher.Handler(
                self._process_notify,
                validator=functools.partial(pr.Notify.validate, response=True)),
            pr.RESPONSE: dispatcher.Handler(
                self._process_response, validator=pr.Response.validate,
                required_properties=("correlation_id",)),
        }

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
        if callback is not None and event_type == task_mod.EVENT_UPDATE_PROGRESS:
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
