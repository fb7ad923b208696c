"""The executor's request path: build a request, publish it, or fail it.

Never waits on a timer (WorkerTaskExecutor mixes this in): a request is
published as soon as a capable worker is known, else it waits and the
release thread publishes it the moment one is discovered.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid as uuidlib
from collections.abc import Callable
from concurrent import futures
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.events import model as event_model
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.worker_side import timelimits as tlim
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

# Who published a request (this process), carried in every request's headers.
ORIGIN = pr.make_origin()

# Put on the release queue by stop(): the release thread ends.
STOP = object()


class RequestPublishing:
    """Submitting and publishing requests for WorkerTaskExecutor (a mixin).

    Expects the attributes annotated below from the class it is mixed into.
    """

    _book: tr.RequestBook
    _proxy: px.Proxy
    _uuid: str
    _transition_timeout: float | None
    _root_id: str | None
    _parent_id: str | None
    _wake: threading.Event
    _stopping: threading.Event
    _releases: queue.SimpleQueue

    def _submit_task(self, task: Any, task_uuid: str, action: str, arguments: dict,
                     progress_callback: Callable | None, **kwargs: Any) -> futures.Future:
        """Create the request and publish it now if a capable worker is known."""
        timeout = self._transition_timeout
        request = pr.Request(task, task_uuid, action, arguments, timeout=timeout, **kwargs)
        deadline = None if timeout is None else request.created_on + timeout
        tracked = tr.Tracked(request, progress_callback, deadline)
        tracked.request_id = uuidlib.uuid4().hex
        route, wake = self._book.submit(tracked)
        if wake or route is None:  # housekeeping warns when no worker shows up
            self._wake.set()
        if route is not None:
            self._publish_request(tracked)
        return request.future

    def _headers_for(self, tracked: tr.Tracked) -> dict[str, Any]:
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
        headers.update(event_model.timing_headers(tracked.origin.created_at))
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

    def _release_loop(self) -> None:
        """Publish waiting requests as soon as a capable worker appears."""
        while True:
            item = self._releases.get()
            if item is STOP or self._stopping.is_set():
                return
            try:
                for tracked in self._book.release_waiting():
                    self._publish_request(tracked)
            except Exception:
                LOG.exception("Failed to release waiting requests")

    def _fail(self, tracked: tr.Tracked, error: exc.FlowEngineError, log: bool = True) -> None:
        """Resolve a request with ``error`` as its failure (logged unless told not to)."""
        try:
            raise error
        except exc.FlowEngineError:
            if log:
                LOG.warning("%s", error)
            tracked.resolve(ft.Failure())
