"""A worker's control server: answers ``flowengine inspect`` and ``flowengine control``.

Each flowengine worker consumes a control queue of its own (private,
deleted with it) bound to the exchange-wide key every worker listens to and
to a key of its own (see :mod:`..wire.control`), in a consume loop of its
own: a worker busy at capacity, whose request loops wait for room, still
answers. Requests are validated (and verified, with signing on) like every
message; one for other workers (``destination``) is ignored.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.messaging import proxy as proxy_mod
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import control as wc
from flowengine.engines.worker_based.wire import names

LOG = logging.getLogger(__name__)

#: Seconds an answer may take to publish before it is given up (the asker
#: waits about a second; a later answer would only be dropped).
REPLY_PUBLISH_TIMEOUT_S = 5.0


class ControlTarget(Protocol):
    """What a control server asks its worker."""

    def describe(self) -> dict[str, Any]:
        """Who the worker is: id, host, pid, topics, tasks, threads... (JSON-ready)."""

    def statistics(self) -> dict[str, Any]:
        """Counters, held requests, uptime, broker connections (JSON-ready)."""

    def requests(self) -> list[dict[str, Any]]:
        """The requests held, queued and running (JSON-ready)."""

    def cancel(self, request_uuid: str) -> dict[str, Any]:
        """Cancel one request here; what was found and done (JSON-ready)."""

    def request_shutdown(self) -> None:
        """Begin a warm shutdown (the answer has been sent already)."""


class ControlServer:
    """Answers the control requests of ``exchange`` for worker ``worker_id``."""

    def __init__(
        self, exchange: str, worker_id: str, broker: BrokerSettings, target: ControlTarget
    ) -> None:
        self._worker_id = worker_id
        self._target = target
        own_key = wc.worker_control_key(worker_id)
        queue = proxy_mod.QueueSpec(
            wc.control_queue_name(exchange, worker_id),
            (wc.CONTROL_ROUTING_KEY, own_key),
            auto_delete=True,
            private=True,
        )
        self._proxy = proxy_mod.Proxy(
            f"control.{worker_id}",
            exchange,
            None,
            broker=broker,
            options=proxy_mod.ProxyOptions(
                queues=[queue],
                wake_routing_key=own_key,
                consume=proxy_mod.ConsumeOptions(
                    # A broker the worker cannot reach is said by its request
                    # loops, once per back-off step; this loop says it at DEBUG.
                    quiet_until_started=True,
                    # A lease of its own: it must not retire the request loops' holdings.
                    lease=proxy_mod.LeaseSpec(f"{worker_id}.control"),
                ),
            ),
        )
        self._proxy.dispatcher.type_handlers[wc.CONTROL] = dispatcher.Handler(
            self._on_control, validator=wc.ControlRequest.validate
        )
        self.answered = 0

    @property
    def proxy(self) -> proxy_mod.Proxy:
        """The proxy the control queue is consumed through."""
        return self._proxy

    @property
    def queue_name(self) -> str:
        """The control queue's name."""
        return self._proxy.queues[0].name

    def start(self) -> None:
        """Consume control requests until stop() (blocks the calling thread)."""
        self._proxy.start()

    def start_thread(self) -> threading.Thread:
        """Run :meth:`start` in a daemon thread of its own."""
        thread = threading.Thread(
            target=self.start, daemon=True, name=f"flowengine-control-{self._worker_id}"
        )
        thread.start()
        return thread

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until consuming; False if ``timeout`` passed first."""
        return self._proxy.wait(timeout)

    def stop(self) -> None:
        """Stop consuming (the queue goes with the worker)."""
        self._proxy.stop()

    def answer(self, request: wc.ControlRequest) -> dict[str, Any]:
        """The result of ``request`` here (raises what acting on it raised)."""
        result: dict[str, Any] = {"worker": self._target.describe()}
        command = request.command
        if command in (wc.ACTIVE, wc.RESERVED):
            wanted = "running" if command == wc.ACTIVE else "queued"
            result["requests"] = [r for r in self._target.requests() if r["state"] == wanted]
        elif command == wc.STATS:
            result["stats"] = self._target.statistics()
        elif command == wc.CANCEL:
            result["cancel"] = self._target.cancel(request.arguments["request"])
        elif command == wc.SHUTDOWN:
            result["shutdown"] = "warm"
        return result

    def _on_control(self, data: dict[str, Any], message: Delivery) -> None:
        request = wc.ControlRequest.from_dict(data)
        if not request.concerns(self._worker_id):
            return
        try:
            reply = wc.ControlReply(self._worker_id, request.command, True, self.answer(request))
        except Exception as e:
            LOG.exception("Control command %r failed", request.command)
            reply = wc.ControlReply(
                self._worker_id, request.command, False, error=f"{type(e).__name__}: {e}"
            )
        LOG.info(
            "Control command %r%s from %s: %s",
            request.command,
            f" {request.arguments}" if request.arguments else "",
            message.headers.get(names.HEADER_ORIGIN, "?"),
            "done" if reply.ok else reply.error,
        )
        reply_to = message.properties.get("reply_to")
        if reply_to:
            try:
                self._proxy.publish(
                    reply,
                    reply_to,
                    correlation_id=message.properties.get("correlation_id"),
                    headers={names.HEADER_WORKER_ID: self._worker_id},
                    timeout_s=REPLY_PUBLISH_TIMEOUT_S,
                )
            except Exception:
                LOG.warning(
                    "Could not answer control command %r to %s",
                    request.command,
                    reply_to,
                    exc_info=True,
                )
        self.answered += 1
        if request.command == wc.SHUTDOWN and reply.ok:
            self._target.request_shutdown()
