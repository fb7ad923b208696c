"""Helpers for executor/engine tests: in-process workers and a hand-driven fake worker."""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from typing import Any

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.engines.worker_based.executor_side.policy import LIVENESS_OPTIONS, RequestPolicy
from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.worker_side import worker as wk
from tests.worker_based.wire_helpers import as_broker

#: Bounded wait (s), only so that a bug fails a test instead of hanging it.
WAIT_S = 10.0

#: Transport the in-process tests use (flowengine's memory transport).
MEMORY = {"transport": "memory"}


def unique(prefix: str = "ex") -> str:
    """A fresh exchange/topic name so tests never share queues."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def running_worker(
    exchange: str, topic: str, tasks: list[Any], threads: int = 2, **conn: Any
) -> Iterator[wk.Worker]:
    """An in-process Worker serving ``tasks`` until the block ends."""
    conn = conn or MEMORY
    # A stdlib pool: its idle threads leave at once on shutdown (futurist's
    # linger up to a second), which keeps these tests fast.
    pool = futures.ThreadPoolExecutor(max_workers=threads)
    worker = wk.Worker(exchange, topic, tasks, executor=pool, **conn)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    assert worker.wait(WAIT_S), "worker did not start"
    try:
        yield worker
    finally:
        worker.stop()
        pool.shutdown(wait=True)
        thread.join(WAIT_S)


@contextlib.contextmanager
def running_executor(
    exchange: str, topics: list[str], **kwargs: Any
) -> Iterator[wex.WorkerTaskExecutor]:
    """A started WorkerTaskExecutor (memory transport unless told otherwise)."""
    if "transport" not in kwargs and "url" not in kwargs and "broker" not in kwargs:
        kwargs.update(MEMORY)
    if "broker" not in kwargs:
        kwargs = as_broker(kwargs)
    liveness = {key: kwargs.pop(key) for key in LIVENESS_OPTIONS if key in kwargs}
    if liveness:
        kwargs["policy"] = RequestPolicy(**liveness)
    executor = wex.WorkerTaskExecutor(uuid.uuid4().hex, exchange, topics, **kwargs)
    executor.start()
    try:
        yield executor
    finally:
        executor.stop()


def wait_workers(executor: wex.WorkerTaskExecutor, predicate: Any, timeout: float = WAIT_S) -> bool:
    """Wait (on the finder's condition, no polling) until ``predicate(finder)`` holds."""
    finder = executor.finder
    with finder._cond:
        return finder._cond.wait_for(lambda: predicate(finder), timeout)


class FakeWorker:
    """A worker driven by the test: it records requests; the test sends the replies."""

    def __init__(
        self,
        exchange: str,
        topic: str,
        tasks: list[str],
        cond: threading.Condition | None = None,
        consume_topic: bool = True,
        private: bool = False,
        on_request: Any = None,
        **conn: Any,
    ) -> None:
        conn = conn or MEMORY
        self.topic = topic
        self.tasks = list(tasks)
        self.worker_id = f"fake:{uuid.uuid4().hex[:8]}"
        self.answer_notify = True
        self.requests: list[tuple[dict, Any]] = []
        #: NOTIFY requests received (answered or not).
        self.notifies = 0
        # Called as on_request(self, data, message) to answer automatically.
        self._auto = on_request
        # Shareable, so a test can wait for a request on any of several fakes.
        self._cond = cond or threading.Condition()
        handlers = {
            pr.NOTIFY: dispatcher.Handler(
                self._on_notify, functools.partial(pr.Notify.validate, response=False)
            ),
            pr.REQUEST: dispatcher.Handler(self._on_request, pr.Request.validate),
        }
        queues = []
        if consume_topic:
            queues.append(px.QueueSpec(pr.topic_queue_name(exchange, topic), (topic,)))
        if private:
            key = pr.worker_routing_key(topic, self.worker_id)
            queues.append(
                px.QueueSpec(
                    pr.worker_queue_name(exchange, topic, self.worker_id), (key,), auto_delete=True
                )
            )
        wake = pr.worker_routing_key(topic, self.worker_id) if private else topic
        self.proxy = px.Proxy(
            topic,
            exchange,
            handlers,
            **as_broker(conn),
            options=px.ProxyOptions(queues=queues, wake_routing_key=wake),
        )
        self._thread: threading.Thread | None = None

    def _headers(self) -> dict[str, Any]:
        return {pr.HEADER_WORKER_ID: self.worker_id}

    def _on_notify(self, data: Any, message: Any) -> None:
        if self.answer_notify:
            self.proxy.publish(
                pr.Notify(topic=self.topic, tasks=self.tasks),
                message.properties["reply_to"],
                headers=self._headers(),
            )
        with self._cond:
            self.notifies += 1
            self._cond.notify_all()

    def wait_notifies(self, count: int, timeout: float = WAIT_S) -> bool:
        """Wait until ``count`` NOTIFY requests were handled (answered or not)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.notifies >= count, timeout)

    def _on_request(self, data: Any, message: Any) -> None:
        with self._cond:
            self.requests.append((data, message))
            self._cond.notify_all()
        if self._auto is not None:
            self._auto(self, data, message)

    def announce(self, leaving: bool = False) -> None:
        """Publish an announcement (as a real worker does when it starts/stops)."""
        headers = self._headers()
        if leaving:
            headers[pr.HEADER_LEAVING] = True
        self.proxy.publish(
            pr.Notify(topic=self.topic, tasks=[] if leaving else self.tasks),
            pr.ANNOUNCE_ROUTING_KEY,
            headers=headers,
        )

    def wait_requests(self, count: int, timeout: float = WAIT_S) -> bool:
        """Wait until ``count`` requests arrived."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.requests) >= count, timeout)

    def reply(self, message: Any, state: str, **data: Any) -> None:
        """Send a response for a recorded request."""
        self.proxy.publish(
            pr.Response(state, **data),
            message.properties["reply_to"],
            correlation_id=message.properties["correlation_id"],
            headers=self._headers(),
        )

    def reply_raw(self, message: Any, body: Any) -> None:
        """Send an arbitrary body as a RESPONSE (for malformed replies)."""
        self.proxy.publish_body(
            pr.RESPONSE,
            body,
            message.properties["reply_to"],
            correlation_id=message.properties["correlation_id"],
        )

    def __enter__(self) -> FakeWorker:
        self._thread = threading.Thread(target=self.proxy.start, daemon=True)
        self._thread.start()
        assert self.proxy.wait(WAIT_S), "fake worker did not start"
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.proxy.stop()
        if self._thread is not None:
            self._thread.join(WAIT_S)
