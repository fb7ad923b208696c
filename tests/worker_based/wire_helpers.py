"""Test helpers for the worker side: a stand-in executor, raw sends, running workers."""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import kombu

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.worker_side import worker as wk

#: Bounded wait (s) used only to fail instead of hanging.
WAIT_S = 10.0


def conn_kwargs(broker: Any) -> dict[str, Any]:
    """url/transport_options of a conftest ``Broker`` as Proxy/Worker kwargs."""
    return {"url": broker.url, "transport_options": dict(broker.transport_options)}


#: Keyword arguments that say where the broker is and how to talk to it.
BROKER_KEYS = (
    "url",
    "transport",
    "transport_options",
    "retry_options",
    "durable",
    "secret",
    "compat",
)


def as_broker(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the broker keywords replaced by one ``broker=BrokerSettings``."""
    rest = dict(kwargs)
    given = {key: rest.pop(key) for key in BROKER_KEYS if key in rest}
    if "transport_options" in given:
        given["transport_options"] = given["transport_options"] or {}
    return {**rest, "broker": BrokerSettings(**given)}


class Client:
    """Stands in for an executor: consumes its reply queue (+ announcements), records all."""

    def __init__(self, exchange: str, **conn: Any) -> None:
        self.uuid = f"client-{uuid.uuid4().hex[:12]}"
        self.exchange = exchange
        self.responses: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
        self.notifies: list[tuple[dict[str, Any], dict[str, Any]]] = []
        #: The NOTIFYs that answer a probe, by the probe's correlation id
        #: (announcements carry none: they are in ``notifies`` only).
        self.notify_answers: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(
            list
        )
        self._cond = threading.Condition()
        handlers = {
            pr.RESPONSE: dispatcher.Handler(
                self._on_response,
                validator=pr.Response.validate,
                required_properties=("correlation_id",),
            ),
            pr.NOTIFY: dispatcher.Handler(
                self._on_notify, validator=functools.partial(pr.Notify.validate, response=True)
            ),
        }
        self.proxy = px.Proxy(
            self.uuid,
            exchange,
            handlers,
            **as_broker(conn),
            options=px.ProxyOptions(bindings=(pr.ANNOUNCE_ROUTING_KEY,)),
        )
        self._thread: threading.Thread | None = None

    def _on_response(self, data: dict[str, Any], message: Any) -> None:
        with self._cond:
            self.responses[message.properties["correlation_id"]].append(
                (pr.Response.normalize(data), dict(message.headers or {}))
            )
            self._cond.notify_all()

    def _on_notify(self, data: dict[str, Any], message: Any) -> None:
        with self._cond:
            notify = (data, dict(message.headers or {}))
            self.notifies.append(notify)
            probe = message.properties.get("correlation_id")
            if probe:
                self.notify_answers[probe].append(notify)
            self._cond.notify_all()

    def start(self) -> Client:
        self._thread = threading.Thread(target=self.proxy.start, daemon=True)
        self._thread.start()
        assert self.proxy.wait(WAIT_S), "client proxy did not start"
        return self

    def stop(self) -> None:
        self.proxy.stop()
        if self._thread is not None:
            self._thread.join(WAIT_S)
            assert not self._thread.is_alive(), "client proxy did not stop"

    def __enter__(self) -> Client:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT_S) -> bool:
        """Wait (bounded) until ``predicate()`` holds; checked on every arrival."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def answers(self, probe: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The NOTIFY answers (data, headers) to the probe sent with correlation id ``probe``."""
        with self._cond:
            return list(self.notify_answers.get(probe, []))

    def states(self, cid: str) -> list[str]:
        with self._cond:
            return [d["state"] for d, _h in self.responses.get(cid, [])]

    def request(
        self,
        task: Any,
        action: str = pr.EXECUTE,
        arguments: Any = None,
        routing_key: str = "",
        headers: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        """Publish a Request for ``task``; return its correlation id."""
        cid = uuid.uuid4().hex
        req = pr.Request(task, cid, action, arguments or {}, **kwargs)
        self.proxy.publish(
            req, routing_key, reply_to=self.uuid, correlation_id=cid, headers=headers
        )
        return cid

    def final(self, cid: str, timeout: float = WAIT_S) -> dict[str, Any]:
        """The SUCCESS/FAILURE response for ``cid`` (fails the test if none comes)."""
        done = (pr.SUCCESS, pr.FAILURE)
        ok = self.wait_for(lambda: any(s in done for s in self.states(cid)), timeout)
        assert ok, f"no final reply for {cid}; got {self.states(cid)}"
        with self._cond:
            for data, _headers in self.responses[cid]:
                if data["state"] in done:
                    return data
        raise AssertionError("unreachable")


class RawSender:
    """Publishes arbitrary bytes with arbitrary properties (for malformed messages)."""

    def __init__(
        self,
        exchange: str,
        url: str | None = None,
        transport: str | None = None,
        transport_options: dict[str, Any] | None = None,
    ) -> None:
        self.conn = kombu.Connection(
            url or "memory://localhost",
            transport=transports.resolve(url, transport),
            transport_options=transport_options or {},
        )
        self.exchange = kombu.Exchange(exchange, type="direct", durable=False, auto_delete=False)
        self.producer = kombu.Producer(self.conn.channel(), exchange=self.exchange)

    def send(
        self,
        body: bytes | str,
        routing_key: str,
        content_type: str = "application/json",
        **properties: Any,
    ) -> None:
        self.producer.publish(
            body,
            routing_key=routing_key,
            content_type=content_type,
            content_encoding="utf-8" if isinstance(body, str) else "binary",
            **properties,
        )

    def close(self) -> None:
        self.conn.release()


@contextlib.contextmanager
def running_worker(exchange: str, topic: str, tasks: Any, **kwargs: Any) -> Iterator[wk.Worker]:
    """A Worker serving in a thread for the duration of the with-block."""
    worker = wk.Worker(exchange, topic, tasks, **kwargs)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker.wait(WAIT_S), "worker did not start"
        yield worker
    finally:
        worker.stop()
        thread.join(WAIT_S)
        assert not thread.is_alive(), "worker did not stop"
