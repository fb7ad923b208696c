"""The executor's request path: build a request, publish it, or fail it.

Never waits on a timer: a request is published as soon as a capable worker
is known, else it waits in the book and the release thread publishes it the
moment one is discovered (:meth:`RequestPublisher.signal_workers_changed`).
"""

from __future__ import annotations

import logging
import queue
import uuid as uuidlib
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.events import model as event_model
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import timelimits
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

__all__ = ["ORIGIN", "RequestPublisher"]

#: Who published a request (this process), carried in every request's headers.
ORIGIN = pr.make_origin()

# Put on the release queue by stop(): the release thread ends.
_STOP = object()


class RequestPublisher:
    """Turns the engine's execute/revert calls into published requests.

    ``book`` holds every unfinished request; ``reply_to`` is the executor's
    reply routing key; ``transition_timeout`` (s, None: none) gives each
    request its deadline. ``on_new_deadline()`` is called when a submitted
    request brings a deadline earlier than any the housekeeper waits for
    (or waits for a worker nobody has seen yet). ``loss_bound``: headers
    telling workers when this engine takes a silent holder for lost.
    """

    def __init__(self, proxy: px.Proxy, book: tr.RequestBook, reply_to: str,
                 transition_timeout: float | None, *,
                 on_new_deadline: Callable[[], None],
                 loss_bound: Mapping[str, Any] | None = None) -> None:
        self._proxy = proxy
        self._book = book
        self._reply_to = reply_to
        self._transition_timeout = transition_timeout
        self._on_new_deadline = on_new_deadline
        self._loss_bound = dict(loss_bound or {})
        self._releases: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._root_id: str | None = None
        self._parent_id: str | None = None

    def set_trace_ids(self, root_id: str | None, parent_id: str | None) -> None:
        """The flow (and flow detail) every request belongs to, for tracing."""
        self._root_id, self._parent_id = root_id, parent_id

    def submit(self, task: Any, task_uuid: str, action: str, arguments: dict[str, Any],
               progress_callback: Callable[..., Any] | None,
               **kwargs: Any) -> futures.Future[Any]:
        """Create the request and publish it now if a capable worker is known."""
        timeout = self._transition_timeout
        request = pr.Request(task, task_uuid, action, arguments, timeout=timeout, **kwargs)
        deadline = None if timeout is None else request.created_on + timeout
        tracked = tr.Tracked(request, progress_callback, deadline)
        tracked.request_id = uuidlib.uuid4().hex
        route, earlier_deadline = self._book.submit(tracked)
        if earlier_deadline or route is None:  # the housekeeper warns if nobody shows up
            self._on_new_deadline()
        if route is not None:
            self.publish(tracked)
        return request.future

    def headers_for(self, tracked: tr.Tracked) -> dict[str, Any]:
        """The flowengine headers that travel with a request."""
        headers: dict[str, Any] = {pr.HEADER_ATTEMPT: tracked.attempt,
                                   pr.HEADER_ORIGIN: ORIGIN}
        if tracked.request_id is not None:
            headers[lv.HEADER_REQUEST_ID] = tracked.request_id
        if tracked.deadline is not None:
            # Nobody waits for an unstarted request after its transition
            # timeout: a worker that would start it later drops it unrun
            # (expires is a little earlier than our deadline; see liveness.py).
            headers[pr.HEADER_EXPIRES] = lv.expires_at(tracked.deadline,
                                                       self._transition_timeout or 0.0)
        headers.update(self._loss_bound)
        headers.update(event_model.timing_headers(tracked.origin.created_at))
        limits = timelimits.header_for(tracked.request.task)
        if limits is not None:
            headers[pr.HEADER_TIMELIMIT] = limits
        if self._root_id is not None:
            headers[pr.HEADER_ROOT_ID] = self._root_id
        if self._parent_id is not None:
            headers[pr.HEADER_PARENT_ID] = self._parent_id
        return headers

    def publish(self, tracked: tr.Tracked) -> None:
        """Publish one routed request; fail it if that fails."""
        request = tracked.request
        try:
            self._proxy.publish(request, tracked.routing_key or "", reply_to=self._reply_to,
                                correlation_id=request.uuid,
                                headers=self.headers_for(tracked))
        except Exception as e:
            LOG.error("Failed to publish request %s to %r: %s", request,
                      tracked.routing_key, e, exc_info=True)
            failure = ft.Failure.from_exception(e)
            with self._book.lock:
                if not self._book.is_current(tracked) or tracked.request is not request:
                    return
                self._book.remove(tracked)
                tr.transition(tracked, pr.FAILURE)
            tracked.resolve(failure)

    def fail(self, tracked: tr.Tracked, error: exc.FlowEngineError, log: bool = True) -> None:
        """Resolve a request with ``error`` as its failure (logged unless told not to)."""
        if log:
            LOG.warning("%s", error)
        tracked.resolve(ft.Failure.from_exception(error))

    # --- the release thread ---

    def signal_workers_changed(self) -> None:
        """A worker appeared or changed: waiting requests may have a route now.

        Always signalled (not only when something waits right now): a request
        being submitted concurrently may join the waiting list just after a check.
        """
        self._releases.put(True)

    def run_releases(self) -> None:
        """Publish waiting requests as soon as a capable worker appears (until stop)."""
        while True:
            if self._releases.get() is _STOP:
                return
            try:
                for tracked in self._book.release_waiting():
                    self.publish(tracked)
            except Exception:
                LOG.exception("Failed to release waiting requests")

    def stop(self) -> None:
        """End run_releases() and forget pending signals."""
        self._releases.put(_STOP)

    def drain_signals(self) -> None:
        """Forget the signals nobody consumed (after the release thread ended)."""
        while True:
            try:
                self._releases.get_nowait()
            except queue.Empty:
                return
