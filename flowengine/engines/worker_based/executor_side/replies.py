"""The executor's reply handling: what workers say about our requests and themselves.

Each reply is handled as it arrives, in whatever order, in the reply
consumer's thread: announcements and NOTIFY answers update discovery;
PENDING/RUNNING/EVENT replies refresh a request's liveness; SUCCESS/FAILURE
resolve the engine's future exactly once.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine import task as task_mod
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import discovery
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.engines.worker_based.messaging import compat as compat_mod
from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)


class ReplyHandler:
    """Handles the messages on one executor's reply queue.

    ``executor_uuid`` names the executor in logs; each finished request's
    timings go to its owner's statistics. Callbacks: ``probe(topic, worker_id)``
    asks a worker we never heard from who it is; ``wake_housekeeper()`` says a
    deadline changed; ``release_waiting()`` says a request waits for a route
    again.
    """

    def __init__(
        self,
        executor_uuid: str,
        book: tr.RequestBook,
        finder: discovery.ProxyWorkerFinder,
        policy: RequestPolicy,
        *,
        probe: Callable[[str, str], None],
        wake_housekeeper: Callable[[], None],
        release_waiting: Callable[[], None],
    ) -> None:
        self._uuid = executor_uuid
        self._book = book
        self._finder = finder
        self._policy = policy
        self._probe = probe
        self._wake_housekeeper = wake_housekeeper
        self._release_waiting = release_waiting
        # worker id -> when we last asked it privately who it is.
        self._probed: dict[str, float] = {}

    def handlers(self) -> dict[str, dispatcher.Handler]:
        """The reply queue's handlers by message type, with their validators."""
        return {
            pr.NOTIFY: dispatcher.Handler(
                self.process_notify, validator=functools.partial(pr.Notify.validate, response=True)
            ),
            pr.RESPONSE: dispatcher.Handler(
                self.process_response,
                validator=pr.Response.validate,
                required_properties=("correlation_id",),
            ),
        }

    def process_notify(self, data: dict[str, Any], message: Any) -> None:
        """A worker answered NOTIFY or announced itself (or is leaving)."""
        worker = self._finder.process_response(data, message)
        if worker is not None and worker.topic not in self._finder.topics:
            # Learned by listening: keep the new topic in the NOTIFY beat so
            # the worker's liveness keeps being refreshed.
            self._finder.add_topic(worker.topic)

    def process_response(self, data: dict[str, Any], message: Any) -> None:
        """A reply for one of our requests: PENDING, RUNNING, EVENT, SUCCESS or FAILURE."""
        request_uuid = message.properties.get("correlation_id")
        tracked = self._book.get(request_uuid)
        headers = Headers.parse(message.headers)
        if tracked is None:
            if headers.declined:
                LOG.info(
                    "Worker %s got request %s again from the broker (a redelivery) and"
                    " did not run it: its outcome is already in (or nobody waits for"
                    " it), so it is not sent again",
                    headers.worker_id,
                    request_uuid,
                )
            else:
                LOG.debug(
                    "Ignoring response for request %s: not waiting for it"
                    " (finished, timed out or someone else's)",
                    request_uuid,
                )
            return
        response = pr.Response.from_dict(data)
        state = response.state
        if headers.attempt is not None and headers.attempt != tracked.attempt:
            # Fencing: a worker still answering for a dispatch we replaced
            # (it was declared lost) must not complete or refresh the new one.
            LOG.info(
                "Ignored %s reply for request %s from worker %s: it is for attempt %d,"
                " superseded by attempt %d",
                state,
                request_uuid,
                headers.worker_id,
                headers.attempt,
                tracked.attempt,
            )
            return
        worker_id = headers.worker_id
        if headers.declined and state == pr.PENDING:
            self._declined(tracked, headers)
            return
        if worker_id is not None:
            self._maybe_probe(tracked, worker_id)
        else:
            compat_mod.note_reply(message.headers, self._uuid, tracked.topic, tracked.request)
        if state in (pr.PENDING, pr.RUNNING):
            lost_after = self._policy.lost_after_for(headers.heartbeat_s)
            with self._book.lock:
                wake = False
                if self._book.is_current(tracked) and (
                    state == pr.PENDING or tr.transition(tracked, pr.RUNNING)
                ):
                    wake = self._book.heard(tracked, worker_id, lost_after)
                    if tracked.request.current_state == pr.RUNNING:
                        wake = self._book.limit_run(tracked, self._policy.run_timeout) or wake
            if wake:
                self._wake_housekeeper()
        elif state == pr.EVENT:
            if tracked.worker_id is not None:
                tracked.last_heard = time.monotonic()
            self._on_event(tracked, response.data)
        elif state in (pr.SUCCESS, pr.FAILURE):
            self._complete(tracked, state, response.data.get("result"), worker_id, headers.run_s)
        else:
            LOG.warning(
                "Ignoring response for request %s in unexpected state %r", request_uuid, state
            )

    def _declined(self, tracked: tr.Tracked, headers: Headers) -> None:
        """A worker handed back a redelivery of a request we still wait for, unrun.

        If a worker we heard from lately holds it, it is left to that worker.
        Otherwise its first taker may still run it (its acknowledgement was
        lost, its PENDING may be late): it is dispatched again only if nobody
        says it holds it within a loss bound (see RequestBook.await_holder).
        """
        now = time.monotonic()
        grace = self._policy.lost_after_for(headers.heartbeat_s)
        with self._book.lock:
            if not self._book.is_current(tracked):
                return
            holder = tracked.worker_id
            if holder is not None and holder != headers.worker_id:
                LOG.info(
                    "Worker %s handed back a redelivery of request %s unrun; worker %s"
                    " holds it (last heard %.1f s ago), so it is left to that worker",
                    headers.worker_id,
                    tracked.request,
                    holder,
                    now - (tracked.last_heard or now),
                )
                return
            wake = self._book.await_holder(tracked, headers.worker_id, grace)
        LOG.info(
            "Worker %s handed back a redelivery of request %s unrun; unless a worker"
            " says it holds it within %.1f s, it is dispatched again",
            headers.worker_id,
            tracked.request,
            grace,
        )
        if wake:
            self._wake_housekeeper()

    def _complete(
        self,
        tracked: tr.Tracked,
        state: str,
        result: Any,
        worker_id: str | None,
        run_s: float | None,
    ) -> None:
        """SUCCESS or FAILURE arrived: resolve the engine's future (exactly once).

        ``run_s``: how long the body ran, by its worker (header ``run_s``).
        """
        with self._book.lock:
            if not self._book.is_current(tracked):
                return
            if state == pr.SUCCESS:
                # A flowengine worker tells RUNNING only about a request that
                # runs a while, and a SUCCESS may overtake its RUNNING (e.g.
                # on the filesystem transport): pass through RUNNING first.
                tr.transition(tracked, pr.RUNNING)
            elif worker_id is not None and self._refused_as_unknown(tracked, result, worker_id):
                return
            elif self._given_back(tracked, result):
                return
            if not tr.transition(tracked, state):
                return
            self._book.remove(tracked)
        tracked.owner.statistics.record(tracked, run_s)
        tracked.resolve(result)

    def _on_event(self, tracked: tr.Tracked, data: dict[str, Any]) -> None:
        """Forward a task event (progress) to the engine and the task's own notifier."""
        event_type, details = data["event_type"], data["details"]
        callback = tracked.progress_callback
        if callback is not None and event_type == task_mod.EVENT_UPDATE_PROGRESS:
            try:
                callback(event_type, details)
            except Exception:
                LOG.warning(
                    "Progress callback failed for request %s", tracked.request, exc_info=True
                )
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
            if last is not None and now - last < discovery.NOTIFY_PERIOD_S:
                return
            self._probed[worker_id] = now
        self._probe(topic, worker_id)

    def _given_back(self, tracked: tr.Tracked, result: Any) -> bool:
        """A worker in a cold shutdown gave the request back: dispatch it again (lock held).

        The worker killed (process executor) or abandoned (exiting) the body
        before replying WorkerShutdown, so the next attempt never overlaps it.
        """
        if (
            not isinstance(result, ft.Failure)
            or not result.check(exc.WorkerShutdown)
            or self._policy.is_last_attempt(tracked.attempt)
        ):
            return False
        LOG.warning(
            "Request %s was given back by its worker (%s); dispatching it again (attempt %d of %d)",
            tracked.request,
            result.exception_str,
            tracked.attempt + 2,
            self._policy.max_attempts,
        )
        self._book.new_attempt(tracked, route_now=False)
        self._release_waiting()  # the sender thread routes it to another worker
        return True

    def _refused_as_unknown(self, tracked: tr.Tracked, result: Any, worker_id: str) -> bool:
        """Re-route a request that a not-yet-known worker refused (lock held).

        Happens when a topic is shared by workers we had not all heard from:
        the request waits until that worker's answer to our probe updates the
        routes, then goes to one that can run it (within MAX_ATTEMPTS).
        """
        if (
            not isinstance(result, ft.Failure)
            or not result.check(exc.UnknownTask)
            or tracked.routing_key != tracked.topic
            or self._policy.is_last_attempt(tracked.attempt)
        ):
            return False
        LOG.warning(
            "A worker on topic %r cannot run %s; routing request %s again once"
            " its task list is known",
            tracked.topic,
            discovery.task_class_name(tracked.request.task),
            tracked.request,
        )
        _, wake = self._book.new_attempt(tracked, route_now=False, after_worker=worker_id)
        if wake:
            self._wake_housekeeper()
        return True
