"""The executor's request path: build a request, publish it, or fail it.

Never waits on a timer: a request is published as soon as a capable worker
is known, else it waits in the book and the sender thread publishes it the
moment one is discovered (:meth:`RequestPublisher.signal_workers_changed`).

On Redis the engine hands over requests faster than the broker takes them
one by one (it schedules every ready task in one go: 500 at the start of a
500-task unordered flow, a round trip each), so there submit() queues a
routed request that comes in such a burst; the sender thread publishes
whatever is queued when it wakes as one batch, in order (one round trip per
batch), while the engine goes on scheduling and the reply consumer goes on
completing. A request that comes alone (the next task of a chain) is
published by submit() itself: handing it to the sender would add a thread
wake-up to every task. On transports where a batch saves nothing (AMQP
publishes without waiting for the broker; memory, filesystem) submit()
always publishes itself: measured, handing bursts to a second thread there
only made the engine's threads compete for the interpreter.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

from flowengine import exceptions as exc
from flowengine import tracing
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.events import model as event_model
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import names, timelimits
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

__all__ = ["ORIGIN", "RequestPublisher"]

#: Who published a request (this process), carried in every request's headers.
ORIGIN = pr.make_origin()

# Put on the sender's queue by stop(): the sender thread ends.
_STOP = object()

# Put on the sender's queue when workers changed: release waiting requests.
_RELEASE = object()

#: On a transport that batches (Redis): a request submitted less than this
#: (s) after the previous submit() returned is taken as part of a burst (the
#: engine scheduling every ready task in one go: ~50-100 us apart) and queued
#: for the sender's batch; a later one is published by submit() at once,
#: sparing it the sender's wake-up (~0.3 ms on a busy 2-core machine).
BURST_GAP_S = 0.0005

#: Most requests published as one batch: bounds the memory a batch holds and
#: how long the first of them waits for the last to be encoded (~50 us each).
PUBLISH_BATCH_MAX = 256


class RequestPublisher:
    """Turns the engine's execute/revert calls into published requests.

    ``book`` holds every unfinished request; ``reply_to`` is the executor's
    reply routing key; ``transition_timeout`` (s, None: none) gives each
    request its deadline. ``on_new_deadline()`` is called when a submitted
    request brings a deadline earlier than any the housekeeper waits for
    (or waits for a worker nobody has seen yet). ``policy_headers``: headers
    every request carries, telling workers when this engine takes a silent
    holder for lost and whether it takes a late PENDING.
    ``late_pending_for(routing_key)``: whether a request sent there takes a
    late PENDING besides (RequestPolicy.late_pending None: where every
    worker it may reach settles it after its run, finder.settles_after_run).
    """

    def __init__(
        self,
        proxy: px.Proxy,
        book: tr.RequestBook,
        reply_to: str,
        transition_timeout: float | None,
        *,
        on_new_deadline: Callable[[], None],
        policy_headers: Mapping[str, Any] | None = None,
        late_pending_for: Callable[[str], bool] | None = None,
    ) -> None:
        self._proxy = proxy
        self._late_pending_for = late_pending_for
        self._book = book
        self._reply_to = reply_to
        self._transition_timeout = transition_timeout
        self._on_new_deadline = on_new_deadline
        self._policy_headers = dict(policy_headers or {})
        # Routed requests to publish (Tracked), _RELEASE and _STOP, in order.
        self._outbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        # Requests queued or being published by the sender: while any are,
        # submit() queues too (publishing itself would overtake them).
        self._unsent = 0
        self._last_submit = float("-inf")
        self._unsent_lock = threading.Lock()
        self._batching = proxy.batches_publications

    def submit(
        self,
        owner: tr.Owner,
        task: Any,
        task_uuid: str,
        action: str,
        arguments: dict[str, Any],
        progress_callback: Callable[..., Any] | None,
        **kwargs: Any,
    ) -> futures.Future[Any]:
        """Create ``owner``'s request and, if a capable worker is known, publish it.

        Published here, or (a burst on a batching transport) queued for the
        sender thread's next batch; see the module docstring.
        """
        timeout = self._transition_timeout
        request = pr.Request(task, task_uuid, action, arguments, timeout=timeout, **kwargs)
        deadline = None if timeout is None else request.created_on + timeout
        tracked = tr.Tracked(request, progress_callback, deadline, owner)
        tracked.request_id = uuidlib.uuid4().hex
        route, earlier_deadline = self._book.submit(tracked)
        if earlier_deadline or route is None:  # the housekeeper warns if nobody shows up
            self._on_new_deadline()
        if route is not None:
            with self._unsent_lock:
                alone = not self._batching or (
                    self._unsent == 0 and time.monotonic() - self._last_submit > BURST_GAP_S
                )
                if not alone:
                    self._unsent += 1
            if alone:
                self.publish(tracked)
            else:
                self._outbox.put(tracked)
        self._last_submit = time.monotonic()
        return request.future

    def headers_for(self, tracked: tr.Tracked) -> dict[str, Any]:
        """The flowengine headers that travel with a request."""
        headers: dict[str, Any] = {pr.HEADER_ATTEMPT: tracked.attempt, pr.HEADER_ORIGIN: ORIGIN}
        if tracked.request_id is not None:
            headers[lv.HEADER_REQUEST_ID] = tracked.request_id
        if tracked.deadline is not None:
            # Nobody waits for an unstarted request after its transition
            # timeout: a worker that would start it later drops it unrun
            # (expires is a little earlier than our deadline; see liveness.py).
            headers[pr.HEADER_EXPIRES] = lv.expires_at(
                tracked.deadline, self._transition_timeout or 0.0
            )
        headers.update(self._policy_headers)
        late_pending_for = self._late_pending_for
        if (
            late_pending_for is not None
            and tracked.routing_key is not None
            and late_pending_for(tracked.routing_key)
        ):
            headers[names.HEADER_LATE_PENDING] = True
        headers.update(event_model.timing_headers(tracked.origin.created_at))
        limits = timelimits.header_for(tracked.request.task)
        if limits is not None:
            headers[pr.HEADER_TIMELIMIT] = limits
        owner = tracked.owner
        if owner.root_id is not None:
            headers[pr.HEADER_ROOT_ID] = owner.root_id
        if owner.parent_id is not None:
            headers[pr.HEADER_PARENT_ID] = owner.parent_id
        trace_context = tracing.request_headers(tracked.request.uuid)
        if trace_context:  # the engine's span for this atom (OpenTelemetry)
            headers.update(trace_context)
        return headers

    def publish(self, tracked: tr.Tracked) -> None:
        """Publish one routed request now; fail it if that fails."""
        self.publish_batch([tracked])

    def publish_batch(self, batch: list[tr.Tracked]) -> None:
        """Publish routed requests in order, together where the transport can.

        A request that cannot be encoded fails alone; when sending fails,
        the requests that did not go out fail with the error.
        """
        ready: list[tuple[tr.Tracked, pr.Request, px.Outgoing]] = []
        for tracked in batch:
            request = tracked.request
            try:
                outgoing = self._proxy.prepare(
                    request,
                    tracked.routing_key or "",
                    reply_to=self._reply_to,
                    correlation_id=request.uuid,
                    headers=self.headers_for(tracked),
                )
            except Exception as e:
                self._publish_failed(tracked, request, e)
                continue
            ready.append((tracked, request, outgoing))
        if not ready:
            return
        try:
            self._proxy.send([outgoing for _, _, outgoing in ready])
        except px.BatchNotSent as e:
            for tracked, request, _ in ready[e.sent :]:
                self._publish_failed(tracked, request, e.cause)

    def _publish_failed(self, tracked: tr.Tracked, request: pr.Request, error: Exception) -> None:
        """Fail ``request`` (unless it was superseded or finished meanwhile)."""
        LOG.error(
            "Failed to publish request %s to %r: %s",
            request,
            tracked.routing_key,
            error,
            exc_info=error,
        )
        failure = ft.Failure.from_exception(error)
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

    # --- the sender thread ---

    def signal_workers_changed(self) -> None:
        """A worker appeared or changed: waiting requests may have a route now.

        Always signalled (not only when something waits right now): a request
        being submitted concurrently may join the waiting list just after a check.
        """
        self._outbox.put(_RELEASE)

    def run_sender(self) -> None:
        """Publish queued and newly routable requests, a batch per wake-up (until stop)."""
        while True:
            batch: list[tr.Tracked] = []
            release = False
            item = self._outbox.get()
            while True:
                if item is _STOP:
                    return  # stop() fails whatever is still unpublished
                if isinstance(item, tr.Tracked):
                    batch.append(item)
                else:  # _RELEASE
                    release = True
                if len(batch) >= PUBLISH_BATCH_MAX:
                    break
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    break
            queued = len(batch)
            try:
                if release:
                    batch.extend(self._book.release_waiting())
                self.publish_batch(batch)
            except Exception:
                LOG.exception("Failed to publish %d request(s)", len(batch))
            finally:
                with self._unsent_lock:
                    self._unsent -= queued

    def stop(self) -> None:
        """End run_sender() and forget pending signals."""
        self._outbox.put(_STOP)

    def drain_signals(self) -> None:
        """Forget what nobody took (after the sender thread ended): the book fails it."""
        with self._unsent_lock:
            self._unsent = 0
        while True:
            try:
                self._outbox.get_nowait()
            except queue.Empty:
                return
