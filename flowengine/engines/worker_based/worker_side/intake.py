"""How a worker takes in messages: checks, duplicates, acknowledgement, hand-over.

A mixin of Server (server.py), which provides the attributes listed on the
class and ``_run``; runs on the consume loop's thread. Nothing a message
contains can make a worker run anything but its endpoints; bad input is
answered with a FAILURE naming the cause when a reply address is known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import compat as compat_mod
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.worker_side import held as rm
from flowengine.engines.worker_based.worker_side.replier import StoredResponse

LOG = logging.getLogger(__name__)

#: Longest single wait (s) of a consume loop waiting for room: it re-checks
#: stop() at least this often.
ROOM_WAIT_SLICE_S = 0.5


def attempt_of(headers: Mapping[str, Any]) -> int | None:
    """The ``attempt`` header as an int (None when absent or unusable)."""
    value = headers.get(pr.HEADER_ATTEMPT)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def request_id_of(headers: Mapping[str, Any]) -> str | None:
    """The ``request_id`` header (None when absent or unusable)."""
    value = headers.get(lv.HEADER_REQUEST_ID)
    return value if isinstance(value, str) and value else None


class IntakeMixin:
    """Taking requests and NOTIFYs off the consume loop for a Server.

    Expects: _worker_id, _topic, _tasks, _endpoints, _proxy, _memory,
    _events, _executor, _room, _capacity, _stopping, _answer_lock, _run and
    the RepliesMixin methods.
    """

    _worker_id: str
    _topic: str
    _tasks: list[str]
    _endpoints: dict[str, Any]
    _proxy: Any
    _memory: rm.RequestMemory
    _events: Any
    _executor: Any
    _room: Any
    _capacity: int | None
    _stopping: Any
    _answer_lock: Any

    def _on_reject(self, message: Any, reason: str) -> None:
        """Answer a refused request with FAILURE when we know where and for what."""
        props = message.properties or {}
        reply_to, task_uuid = props.get("reply_to"), props.get("correlation_id")
        if not reply_to or not task_uuid:
            return
        # Never answer a NOTIFY or a RESPONSE: two confused peers must not
        # bounce failures at each other forever.
        if props.get("type") in (pr.NOTIFY, pr.RESPONSE):
            return
        error = exc.InvalidFormat(f"Worker {self._worker_id} (topic {self._topic!r})"
                                  f" rejected request {task_uuid}: {reason}")
        self._reply_failure(reply_to, task_uuid, error, attempt_of(message.headers or {}))

    def _process_notify(self, data: Any, message: Any) -> None:
        """Answer a NOTIFY request with our topic and tasks (on the consumer thread)."""
        reply_to = message.properties["reply_to"]
        try:
            self._proxy.publish(pr.Notify(topic=self._topic, tasks=self._tasks), reply_to,
                                correlation_id=message.properties.get("correlation_id"),
                                headers=self._headers())
        except Exception:
            LOG.warning("Failed to answer NOTIFY from %s", reply_to, exc_info=True)

    def _drop_expired(self, reply_to: str, task_uuid: str, task_name: Any,
                      expires: float, attempt: int | None, data: Any,
                      headers: Mapping[str, Any]) -> None:
        """Say (log + FAILURE reply) that a request past its ``expires`` is dropped unrun."""
        late = time.time() - expires
        LOG.info("Dropped request %s for task %r unrun: it expired %.3f s ago and nobody"
                 " waits for it any more", task_uuid, task_name, late)
        self._events.expired(task_uuid, data, headers)
        # Its executor has normally given up already and ignores this reply;
        # one whose clock runs behind ours learns the outcome sooner.
        self._reply_failure(reply_to, task_uuid, exc.RequestExpired(
            f"Worker {self._worker_id} dropped request {task_uuid} for task {task_name!r}"
            f" unrun: it expired {late:.3f} s before it could start"), attempt)

    def _process_request(self, data: dict[str, Any], message: Any) -> None:
        """Check a validated request and hand it to the executor; never raises."""
        props = message.properties
        reply_to, task_uuid = props["reply_to"], props["correlation_id"]
        headers = message.headers or {}
        compat_mod.note_request(headers, reply_to, self._worker_id, task_uuid)
        attempt = attempt_of(headers)
        try:
            expires = pr.parse_expires(headers.get(pr.HEADER_EXPIRES))
        except exc.InvalidFormat as e:
            self._reply_failure(reply_to, task_uuid, e, attempt)
            return
        if expires is not None and time.time() > expires:
            self._drop_expired(reply_to, task_uuid, data.get("task_name"), expires, attempt,
                               data, headers)
            return
        try:
            work = pr.Request.from_dict(data, task_uuid=task_uuid)
        except Exception as e:
            self._reply_failure(reply_to, task_uuid, exc.InvalidFormat(
                f"Request {task_uuid} could not be decoded: {e}", cause=e), attempt)
            return
        endpoint = self._endpoints.get(work.task_cls)
        if endpoint is None:
            LOG.warning("Request %s names task class %r, which worker %s does not serve",
                        task_uuid, work.task_cls, self._worker_id)
            self._reply_failure(reply_to, task_uuid, exc.UnknownTask(
                f"Worker {self._worker_id} (topic {self._topic!r}) has no task class"
                f" {work.task_cls!r}; it serves {self._tasks}"), attempt)
            return
        key = (task_uuid, work.action, request_id_of(headers))
        # PENDING replies/heartbeats only to flowengine executors (they send
        # 'attempt'); TaskFlow's would log each one as unexpected.
        verdict = self._memory.admit(key, reply_to, attempt, expires,
                                     announced=attempt is not None)
        if verdict.kind != rm.NEW:
            self._answer_duplicate(verdict, reply_to, task_uuid, work, attempt)
            return
        try:
            task = endpoint.generate(name=work.task_name)
        except Exception as e:
            self._finished(key, None)
            LOG.warning("Could not create task %r of class %s", work.task_name,
                        work.task_cls, exc_info=True)
            self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
                f"Worker {self._worker_id} could not create task {work.task_name!r} of"
                f" class {work.task_cls}: {e}", cause=e), attempt)
            return
        if not self._take(message, reply_to, task_uuid, work, attempt):
            self._finished(key, None)
            return
        self._events.received(task_uuid, work, headers)
        try:
            self._executor.submit(self._run, endpoint, task, work, key, headers)
        except Exception as e:
            self._finished(key, None)
            self._events.forget(task_uuid)
            self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
                f"Worker {self._worker_id} could not schedule request {task_uuid}: {e}",
                cause=e), attempt)
            return
        self._wait_for_room()

    def _take(self, message: Any, reply_to: str, task_uuid: str, work: pr.WorkUnit,
              attempt: int | None) -> bool:
        """Become the request's holder: acknowledge its message; False if we must not run it.

        A flowengine executor (it sends ``attempt``) is told PENDING with the
        acknowledgement, so from then on it knows who holds the request and
        hears its heartbeats. Had we died before, the broker gives the message
        to another worker (AMQP at once, Redis once our lease lapses); on Redis
        the two are one atomic step, elsewhere PENDING goes first, so a death
        between them leaves an executor told of a holder that went silent
        while the message is redelivered: the next holder's PENDING replaces
        it (or the request is dispatched again after the loss bound).
        """
        try:
            if attempt is not None:
                self._proxy.publish(pr.Response(pr.PENDING), reply_to,
                                    correlation_id=task_uuid,
                                    headers=self._headers(attempt), settles=message)
            else:
                message.ack()
            return True
        except exc.DeliveryNotSettled as e:
            LOG.warning("Request %s (%s of %r) not run by worker %s: %s", task_uuid,
                        work.action, work.task_name, self._worker_id, e)
            return False
        except Exception:
            LOG.error("Request %s (%s of %r) not taken by worker %s: its PENDING reply"
                      " could not be sent; the message goes back to the broker", task_uuid,
                      work.action, work.task_name, self._worker_id, exc_info=True)
        message.requeue()
        return False

    def _answer_duplicate(self, verdict: rm.Verdict, reply_to: str, task_uuid: str,
                          work: pr.WorkUnit, attempt: int | None) -> None:
        """Answer a request already held or finished here from memory (never run it again)."""
        what = f"{work.action} of {work.task_name!r}"
        if verdict.kind == rm.STALE:
            LOG.warning("Ignored request %s (%s), attempt %s: attempt %s of it is already"
                        " held here", task_uuid, what, attempt, verdict.held.attempt)
            return
        if verdict.kind == rm.HELD:
            held = verdict.held
            with self._answer_lock:  # its state must not turn ANSWERED meanwhile
                state, outcome = held.state, held.outcome
                LOG.warning("Duplicate of request %s (%s, attempt %s): it is already %s here;"
                            " not running it again", task_uuid, what, attempt,
                            {rm.RUNNING: "running", rm.ANSWERED: "answered"}.get(state,
                                                                                "queued"))
                if state != rm.ANSWERED and (state == rm.RUNNING or attempt is not None):
                    self._reply(reply_to, task_uuid, state, held.attempt)
            if state == rm.ANSWERED and outcome is not None:
                # Its outcome is on its way to the earlier sender; this one
                # (maybe a newer attempt) gets it too, as from the finished ones.
                self._send_remembered(outcome, reply_to, task_uuid, attempt)
            return
        done = verdict.finished
        LOG.warning("Duplicate of request %s (%s, attempt %s): it finished here %.1f s ago;"
                    " sending its outcome again, not running it again", task_uuid, what,
                    attempt, time.monotonic() - done.finished_at)
        if done.outcome is not None:
            self._send_remembered(done.outcome, reply_to, task_uuid, attempt)
            return
        self._reply_failure(reply_to, task_uuid, exc.ExecutionFailure(
            f"Request {task_uuid} ({what}) already ran on worker {self._worker_id}; its"
            f" outcome ({done.outcome_bytes} bytes) was too large to keep for duplicates"),
            attempt)

    def _send_remembered(self, outcome: dict[str, Any], reply_to: str, task_uuid: str,
                         attempt: int | None) -> None:
        """Send a request's outcome body again, for a duplicate of it."""
        try:
            self._proxy.publish(StoredResponse(outcome), reply_to, correlation_id=task_uuid,
                                headers=self._headers(attempt))
        except Exception:
            LOG.error("Failed to send the remembered outcome of request %s to %s",
                      task_uuid, reply_to, exc_info=True)

    def _wait_for_room(self) -> None:
        """Block the consume loop while more than ``capacity`` requests are held.

        So at most capacity + 1 are held (the last one taken before the loop
        noticed); NOTIFY requests wait meanwhile, but the heartbeat thread
        keeps announcing this worker. Returns at once on stop().
        """
        if self._capacity is None:
            return
        with self._room:
            while len(self._memory) > self._capacity and not self._stopping.is_set():
                self._room.wait(ROOM_WAIT_SLICE_S)

    def _finished(self, key: rm.Key, outcome: dict[str, Any] | None) -> None:
        """A held request is answered (or given up): remember it, make room."""
        if outcome is None:
            self._memory.forget(key)
        else:
            self._memory.finish(key, outcome)
        with self._room:
            self._room.notify_all()
