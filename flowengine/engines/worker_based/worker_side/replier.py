"""What a worker says to executors: replies, outcomes, heartbeats, announcements.

A mixin of Server (server.py), which provides the attributes listed on the
class. Heartbeats come from a thread of its own, so neither busy task
threads nor a consume loop waiting for room can delay them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.worker_side import held as rm
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

#: Seconds between repeated announcements (executors forget a worker after
#: worker_expiry seconds of silence; they are sent by the heartbeat thread,
#: so a consume loop waiting for room never makes a worker look dead).
ANNOUNCE_PERIOD_S = pr.NOTIFY_PERIOD_S


def failure_from(error: BaseException) -> ft.Failure:
    """A Failure for an exception created (not raised) here: no traceback to show."""
    return ft.Failure.from_exception(error)


class StoredResponse(pr.Message):
    """A reply body remembered from an earlier run, sent again as it was."""

    TYPE = pr.RESPONSE

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def to_dict(self) -> dict[str, Any]:
        return self._body


class RepliesMixin:
    """Publishing to executors for a Server.

    Expects: _worker_id, _origin, _interval, _topic, _tasks, _proxy,
    _memory, _events, _stopping, _beat_wake, _last_announce, _answer_lock.
    """

    _worker_id: str
    _origin: str
    _interval: float
    _topic: str
    _tasks: list[str]
    _proxy: Any
    _memory: rm.RequestMemory
    _events: Any
    _stopping: Any
    _beat_wake: Any
    _last_announce: float
    _answer_lock: Any

    def _headers(self, attempt: int | None = None, **extra: Any) -> dict[str, Any]:
        headers = {pr.HEADER_WORKER_ID: self._worker_id, pr.HEADER_ORIGIN: self._origin,
                   lv.HEADER_HEARTBEAT: self._interval}
        if attempt is not None:
            headers[pr.HEADER_ATTEMPT] = attempt
        headers.update(extra)
        return headers

    def _announce(self, leaving: bool = False) -> None:
        """Tell every executor who we are and what we run (or that we leave)."""
        tasks = [] if leaving else self._tasks
        headers = self._headers(**({pr.HEADER_LEAVING: True} if leaving else {}))
        try:
            self._proxy.publish(pr.Notify(topic=self._topic, tasks=tasks),
                                pr.ANNOUNCE_ROUTING_KEY, headers=headers)
        except Exception:
            LOG.warning("Worker %s could not announce itself%s", self._worker_id,
                        " leaving" if leaving else "", exc_info=True)
        self._last_announce = time.monotonic()

    def _reply(self, reply_to: str, task_uuid: str, state: str,
               attempt: int | None = None, **data: Any) -> bool:
        """Publish a Response; False (logged) when it could not be sent."""
        try:
            self._proxy.publish(pr.Response(state, **data), reply_to,
                                correlation_id=task_uuid, headers=self._headers(attempt))
        except Exception:
            LOG.error("Failed to send %s reply for request %s to %s", state, task_uuid,
                      reply_to, exc_info=True)
            return False
        return True

    def _reply_failure(self, reply_to: str, task_uuid: str, error: BaseException,
                       attempt: int | None = None) -> bool:
        """Publish a FAILURE reply describing ``error``."""
        return self._reply(reply_to, task_uuid, pr.FAILURE, attempt,
                           result=failure_from(error))

    def _send_outcome(self, held: rm.Held, task_uuid: str, work: pr.WorkUnit, state: str,
                      result: Any) -> dict[str, Any] | None:
        """Publish SUCCESS/FAILURE; return the body sent (None if nothing was sent).

        An unencodable outcome becomes a FAILURE naming why.
        """
        response = pr.Response(state, result=result)
        try:
            body = response.to_dict()
            self._answering(held, body)
            self._proxy.publish(StoredResponse(body), held.reply_to,
                                correlation_id=task_uuid, headers=self._headers(held.attempt))
            return body
        except exc.SerializationFailure as e:
            what = "result" if state == pr.SUCCESS else "failure"
            error = exc.SerializationFailure(
                f"The {what} of task {work.task_name!r} ({work.task_cls}, {work.action})"
                f" cannot be sent as JSON: {e.cause or e}")
            LOG.warning("Request %s: %s", task_uuid, error.args[0])
        except Exception:
            LOG.error("Failed to send %s reply for request %s to %s", state, task_uuid,
                      held.reply_to, exc_info=True)
            return None
        body = pr.Response(pr.FAILURE, result=failure_from(error)).to_dict()
        self._answering(held, body)
        try:
            self._proxy.publish(StoredResponse(body), held.reply_to,
                                correlation_id=task_uuid, headers=self._headers(held.attempt))
        except Exception:
            LOG.error("Failed to send FAILURE reply for request %s to %s", task_uuid,
                      held.reply_to, exc_info=True)
            return None
        return body

    def _on_event(self, held: rm.Held, task_uuid: str, event_type: str,
                  details: dict[str, Any]) -> None:
        """Forward a task notification (progress) to the executor as an EVENT."""
        self._events.progress(task_uuid, event_type, details)
        try:
            self._proxy.publish(pr.Response(pr.EVENT, event_type=event_type,
                                            details=dict(details or {})),
                                held.reply_to, correlation_id=task_uuid,
                                headers=self._headers(held.attempt))
        except Exception:
            LOG.warning("Failed to send %s event for request %s", event_type, task_uuid,
                        exc_info=True)

    def _beat_loop(self) -> None:
        """Heartbeat every held request and re-announce, until stopped and idle.

        A thread of its own: busy task threads, a consume loop waiting for
        room or a slow broker hop on the request path cannot delay it (short
        of a task holding the GIL in one C call longer than the bound).
        """
        while not (self._stopping.is_set() and len(self._memory) == 0):
            self._beat_wake.wait(self._interval)
            self._beat_wake.clear()
            try:
                self.send_heartbeats()
                if (not self._stopping.is_set()
                        and time.monotonic() - self._last_announce >= ANNOUNCE_PERIOD_S):
                    self._announce()
            except Exception:
                LOG.exception("Heartbeat of worker %s failed; retrying", self._worker_id)

    def send_heartbeats(self) -> int:
        """Repeat PENDING/RUNNING for every held request now; how many were sent."""
        sent = 0
        for held in self._memory.held():
            # Under the lock _answering takes: a heartbeat is either sent
            # before the outcome or not at all, never after it.
            with self._answer_lock:
                if held.state == rm.ANSWERED:
                    continue
                if held.state == rm.RUNNING or held.announced:
                    self._reply(held.reply_to, held.key[0], held.state, held.attempt)
                    sent += 1
        return sent

    def _answering(self, held: rm.Held, outcome: dict[str, Any] | None = None) -> None:
        """``held``'s outcome is about to be sent: no heartbeat for it from now on.

        ``outcome`` (the reply body) is kept for duplicates that arrive before
        the request is remembered as finished.
        """
        with self._answer_lock:
            held.state = rm.ANSWERED
            held.outcome = outcome

    def running_requests(self) -> list[tuple[tuple[str, str], str, bool]]:
        """Requests taken and not answered yet: ((uuid, action), reply_to, started)."""
        return [(held.key[:2], held.reply_to, held.state != rm.QUEUED)
                for held in self._memory.held()]

    def give_back(self, key: tuple[str, str], error: BaseException) -> bool:
        """Answer held request ``key`` with FAILURE ``error`` (cold shutdown; attempt kept)."""
        for held in self._memory.held():
            if held.key[:2] == key:
                with self._answer_lock:
                    if held.state == rm.ANSWERED:
                        return True  # its own outcome is on its way
                    held.state = rm.ANSWERED
                return self._reply_failure(held.reply_to, key[0], error, held.attempt)
        return False
