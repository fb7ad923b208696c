"""Asking live workers over the broker: broadcast a control request, collect the answers.

Used by ``flowengine inspect``, ``flowengine control``, ``flowengine
queues``, the dashboard, and by an engine stopped with requests in flight
(it asks their workers to cancel them). A :class:`ControlClient` consumes a
reply queue of its own (private, removed when it stops) for the workers'
CONTROL_REPLY answers.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
import uuid as uuidlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from flowengine.engines.worker_based.messaging import dispatcher, inventory
from flowengine.engines.worker_based.messaging import proxy as proxy_mod
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import control as wc
from flowengine.engines.worker_based.wire import names

LOG = logging.getLogger(__name__)

#: Seconds a broadcast waits for answers unless told otherwise: a live
#: worker answers within milliseconds; a second covers a loaded machine.
DEFAULT_TIMEOUT_S = 1.0

#: Seconds a broadcast still waits once every expected worker answered: for
#: workers started since (they answer within milliseconds of the others).
EXPECTED_GRACE_S = 0.05

#: Seconds to wait for the reply queue to be consumed before giving up.
START_TIMEOUT_S = 15.0

#: Seconds of an unreachable broker before start() reports it (as engines do).
UNREACHABLE_GIVE_UP_S = 5.0

#: Seconds stop() waits for the consume thread.
STOP_JOIN_TIMEOUT_S = 5.0


class ControlClient:
    """Sends control requests to the workers of ``exchange`` and collects their answers.

    Use as a context manager (or :meth:`start`/:meth:`stop`). start() raises
    BrokerConfigError (wrong URL, login, exchange declared otherwise) or
    BrokerUnavailable (unreachable broker) at once, as engines do.
    """

    def __init__(self, exchange: str, broker: BrokerSettings) -> None:
        self._exchange = exchange
        self._broker = broker
        self._id = f"control-{uuidlib.uuid4().hex}"
        self._queue = proxy_mod.QueueSpec(
            names.reply_queue_name(exchange, self._id),
            (self._id,),
            auto_delete=True,
            private=True,
            batched=True,
        )
        self._proxy = proxy_mod.Proxy(
            self._id,
            exchange,
            None,
            broker=broker,
            options=proxy_mod.ProxyOptions(
                queues=[self._queue],
                wake_routing_key=self._id,
                consume=proxy_mod.ConsumeOptions(quiet_until_started=True),
            ),
        )
        self._proxy.dispatcher.type_handlers[wc.CONTROL_REPLY] = dispatcher.Handler(
            self._on_reply,
            validator=wc.ControlReply.validate,
            required_properties=("correlation_id",),
        )
        self._lock = threading.Lock()
        self._waiting: dict[str, queue_mod.Queue[wc.ControlReply]] = {}
        self._thread: threading.Thread | None = None
        #: Who answered the last broadcast that ran its course: what the next
        #: one waits for before returning early.
        self._last_answered: frozenset[str] | None = None

    @property
    def broker(self) -> BrokerSettings:
        """Where the workers are."""
        return self._broker

    @property
    def exchange(self) -> str:
        """The exchange whose workers are asked."""
        return self._exchange

    @property
    def last_answered(self) -> frozenset[str] | None:
        """The workers that answered the last broadcast that ran its course (None: none did)."""
        return self._last_answered

    @property
    def reply_queue(self) -> str:
        """The queue answers come to (removed by stop())."""
        return self._queue.name

    def __enter__(self) -> ControlClient:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Consume the reply queue (in a thread); raises the broker problem that prevents it."""
        self._thread = threading.Thread(
            target=self._proxy.start, daemon=True, name=f"flowengine-{self._id}"
        )
        self._thread.start()
        problem = self._proxy.wait_started(START_TIMEOUT_S, UNREACHABLE_GIVE_UP_S)
        if problem is not None:
            self.stop()
            raise problem

    def stop(self) -> None:
        """Stop consuming and remove the reply queue."""
        self._proxy.stop()
        if self._thread is not None:
            self._thread.join(STOP_JOIN_TIMEOUT_S)
            self._thread = None
            if self._proxy.has_consumed and inventory.needs_dropping(
                self._broker, self._proxy.private_queues_deleted, self._proxy.template_connection
            ):
                spec = self._queue
                inventory.drop_queue(
                    self._broker,
                    self._exchange,
                    spec.name,
                    spec.routing_keys,
                    auto_delete=spec.auto_delete,
                )

    def ask(
        self,
        command: str,
        arguments: Mapping[str, Any] | None = None,
        destination: Sequence[str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        limit: int | None = None,
        expect: Collection[str] | None = None,
    ) -> list[wc.ControlReply]:
        """Send ``command`` and return the answers received within ``timeout_s``.

        Returns early once ``limit`` answers (or one from each of
        ``destination``) arrived, or once every worker of ``expect`` (by
        default the workers that answered this client's last broadcast)
        answered and a short grace for newcomers passed. Raises InvalidFormat
        for a command or arguments the workers would refuse, and what
        publishing raises.
        """
        request = wc.ControlRequest(
            command, dict(arguments or {}), None if destination is None else tuple(destination)
        )
        wc.ControlRequest.validate(request.to_dict())
        if limit is None and destination is not None:
            limit = len(set(destination))
        if expect is None and destination is None:
            expect = self._last_answered
        correlation_id = uuidlib.uuid4().hex
        answers: queue_mod.Queue[wc.ControlReply] = queue_mod.Queue()
        with self._lock:
            self._waiting[correlation_id] = answers
        try:
            self._proxy.publish(
                request,
                routing_keys(destination),
                reply_to=self._id,
                correlation_id=correlation_id,
                headers={names.HEADER_ORIGIN: names.make_origin()},
            )
            replies = self._collect(
                answers, time.monotonic() + timeout_s, limit, frozenset(expect or ())
            )
            if destination is None and (limit is None or len(replies) < limit):
                self._last_answered = frozenset(r.worker_id for r in replies)
            return replies
        finally:
            with self._lock:
                self._waiting.pop(correlation_id, None)

    @staticmethod
    def _collect(
        answers: queue_mod.Queue[wc.ControlReply],
        deadline: float,
        limit: int | None,
        expect: frozenset[str],
    ) -> list[wc.ControlReply]:
        """Answers until ``deadline``, ``limit`` answers, or ``expect`` all answered (+ grace)."""
        replies: list[wc.ControlReply] = []
        started = time.monotonic()
        missing = set(expect)
        while limit is None or len(replies) < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                reply = answers.get(timeout=left)
            except queue_mod.Empty:
                break
            replies.append(reply)
            missing.discard(reply.worker_id)
            if expect and not missing:
                # Every known worker answered: a worker started since answers
                # about as fast, so wait as long again (at least EXPECTED_GRACE_S).
                elapsed = time.monotonic() - started
                deadline = min(deadline, time.monotonic() + max(elapsed, EXPECTED_GRACE_S))
                expect = frozenset()
        return replies

    def _on_reply(self, data: dict[str, Any], message: Delivery) -> None:
        reply = wc.ControlReply.from_dict(data)
        with self._lock:
            answers = self._waiting.get(message.properties["correlation_id"])
        if answers is None:
            LOG.debug("Late answer of worker %s to %r ignored", reply.worker_id, reply.command)
            return
        answers.put(reply)


def routing_keys(destination: Sequence[str] | None) -> str | list[str]:
    """Where a control request for ``destination`` goes (None: every worker)."""
    if destination is None:
        return wc.CONTROL_ROUTING_KEY
    return [wc.worker_control_key(worker_id) for worker_id in dict.fromkeys(destination)]


__all__ = ["ControlClient", "DEFAULT_TIMEOUT_S", "routing_keys"]
