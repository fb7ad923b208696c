"""One ordered list of hooks through which whatever watches a worker observes and acts.

As Dramatiq's middleware: a :class:`Middleware` has a no-op method per
point in a request's life (and in its consume loops' lives); the worker
walks its list (:class:`MiddlewareChain`) at each point, in list order. The
event stream, the activity ``flowengine inspect`` shows, metrics, tracing,
the exception handlers and fencing are each one middleware
(:mod:`.standard_middleware`, :mod:`.activity`, :mod:`.worker_events`);
``Worker(middleware=[...])`` appends your own.

The points of one request, in order (each names its thread):

1. :meth:`~Middleware.after_receive` -- consume thread: taken.
2. :meth:`~Middleware.refuse_start` -- pool thread: may veto the start.
3. :meth:`~Middleware.after_refuse` -- pool thread, only after a veto.
4. :meth:`~Middleware.before_execute` -- pool thread: the body starts.
5. :meth:`~Middleware.on_progress` -- pool thread, while the body runs.
6. :meth:`~Middleware.override_result` -- pool thread: may replace the result.
7. :meth:`~Middleware.after_execute` -- pool thread: before the outcome is sent.
8. :meth:`~Middleware.after_reply` -- pool thread: the outcome was sent.
9. :meth:`~Middleware.after_release` -- last, once, whatever happened.

A request dropped because it expired calls :meth:`~Middleware.after_expire`
(then, if it had been received, :meth:`~Middleware.after_release`).

An error raised by a middleware is logged and the request goes on, as
does the rest of the list: a broken observer never breaks a request.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from flowengine import task as task_mod
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.worker_side import held as held_mod
from flowengine.engines.worker_based.worker_side.endpoint import Endpoint

LOG = logging.getLogger(__name__)

__all__ = ["Job", "Middleware", "MiddlewareChain"]


@dataclasses.dataclass(frozen=True)
class Job:
    """A request taken by the worker, ready for a pool thread."""

    endpoint: Endpoint
    task: task_mod.BaseTask
    work: pr.WorkUnit
    key: held_mod.Key
    headers: Headers
    #: The topic it came from.
    topic: str = ""
    #: Its entry in the worker's memory (None: not admitted through one).
    held: held_mod.Held | None = dataclasses.field(default=None, compare=False, repr=False)
    #: Set when it is cancelled (see :mod:`.activity`); the body reads it
    #: from its request context.
    cancelled: threading.Event = dataclasses.field(
        default_factory=threading.Event, compare=False, repr=False
    )

    @property
    def task_uuid(self) -> str:
        """The request's (task's) uuid."""
        return self.key[0]


class Middleware:
    """Hooks into a worker's requests and consume loops; every method is a no-op here.

    Subclass it and override what you need. ``job`` is a :class:`Job`:
    the request's endpoint, task, decoded work unit, key, headers, topic
    and cancellation flag.
    """

    # --- one request ---

    def after_receive(self, job: Job) -> None:
        """Consume thread: ``job`` was taken (acknowledged) and goes to the pool next."""

    def refuse_start(self, job: Job) -> BaseException | None:
        """Pool thread, before RUNNING is sent: an error to veto the start, else None.

        The first middleware returning an error vetoes (the others are not
        asked): the request is answered with FAILURE carrying it and never runs.
        """
        return None

    def after_refuse(self, job: Job, error: BaseException) -> None:
        """Pool thread: a middleware vetoed ``job`` with ``error``; it was answered unrun."""

    def before_execute(self, job: Job) -> None:
        """Pool thread (the one running the body): ``job``'s body starts now."""

    def on_progress(self, job: Job, event_type: str, details: Mapping[str, Any]) -> None:
        """Pool thread: the running body reported progress (or another notification)."""

    def override_result(self, job: Job, result: Any) -> Any:
        """Pool thread, once the body ended: the result to report (may replace it).

        ``result`` is the body's result or a Failure; return it unchanged
        to keep it (fencing turns it into a FAILURE RequestFenced here).
        """
        return result

    def after_execute(self, job: Job, result: Any, elapsed_s: float) -> None:
        """Pool thread: the body ended (``result`` may be a Failure); its outcome is sent next."""

    def after_reply(self, job: Job, result: Any, elapsed_s: float) -> None:
        """Pool thread: ``job``'s outcome was sent (or could not be); handlers run here."""

    def after_release(self, job: Job) -> None:
        """``job`` is no longer held: last, once, for every request ``after_receive`` saw.

        On the pool thread; on the consume thread when the pool refused it.
        """

    def after_expire(
        self, topic: str, task_uuid: str, task_name: str | None, headers: Headers
    ) -> None:
        """A request arrived (consume thread) or waited (pool thread) past its expiry: dropped."""

    # --- the worker's consume loops (one per topic) ---

    def after_consumer_start(self, topic: str) -> None:
        """Consume thread of ``topic``: consuming (re)started, queues declared."""

    def on_consumer_period(self, topic: str) -> None:
        """Consume thread of ``topic``: called about every wait period (1 s) while it runs."""

    def after_consumer_failing(self, topic: str, reason: str | None) -> None:
        """Consume thread of ``topic``: it keeps failing (``reason``), or works again (None)."""

    def after_server_stop(self, topic: str) -> None:
        """Thread calling stop(): ``topic`` stopped consuming (held requests go on)."""


#: The hook points of :class:`Middleware`, by name.
_HOOKS = tuple(
    name for name, value in vars(Middleware).items() if callable(value) and not name.startswith("_")
)


def _overrides(item: Middleware, hook: str) -> bool:
    """Whether ``item`` does anything at ``hook`` (its method is not the base class's no-op)."""
    method = getattr(item, hook)
    return getattr(method, "__func__", method) is not getattr(Middleware, hook)


class MiddlewareChain:
    """Walks an ordered list of middleware at each hook point, logging (never raising) errors.

    The list is fixed when the chain is made; at each hook point only the
    middleware that override that hook are called (most hear of a few
    points only, and this runs several times per request).
    """

    def __init__(self, middleware: Iterable[Middleware] = ()) -> None:
        self._middleware: tuple[Middleware, ...] = tuple(middleware)
        self._by_hook: dict[str, tuple[Middleware, ...]] = {
            hook: tuple(m for m in self._middleware if _overrides(m, hook)) for hook in _HOOKS
        }

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The middleware, in the order they are called."""
        return self._middleware

    def __iter__(self) -> Iterator[Middleware]:
        return iter(self._middleware)

    def _each(self, what: str, call: Callable[[Middleware], object]) -> None:
        for item in self._by_hook[what]:
            try:
                call(item)
            except Exception:
                LOG.exception("Middleware %r failed in %s; going on without it", item, what)

    def after_receive(self, job: Job) -> None:
        """See :meth:`Middleware.after_receive`."""
        self._each("after_receive", lambda m: m.after_receive(job))

    def refuse_start(self, job: Job) -> BaseException | None:
        """The first veto of the list (see :meth:`Middleware.refuse_start`), or None."""
        for item in self._by_hook["refuse_start"]:
            try:
                error = item.refuse_start(job)
            except Exception:
                LOG.exception("Middleware %r failed in refuse_start; not vetoing", item)
                continue
            if error is not None:
                return error
        return None

    def after_refuse(self, job: Job, error: BaseException) -> None:
        """See :meth:`Middleware.after_refuse`."""
        self._each("after_refuse", lambda m: m.after_refuse(job, error))

    def before_execute(self, job: Job) -> None:
        """See :meth:`Middleware.before_execute`."""
        self._each("before_execute", lambda m: m.before_execute(job))

    def on_progress(self, job: Job, event_type: str, details: Mapping[str, Any]) -> None:
        """See :meth:`Middleware.on_progress`."""
        self._each("on_progress", lambda m: m.on_progress(job, event_type, details))

    def override_result(self, job: Job, result: Any) -> Any:
        """The result once every middleware had its say (see Middleware.override_result)."""
        for item in self._by_hook["override_result"]:
            try:
                result = item.override_result(job, result)
            except Exception:
                LOG.exception("Middleware %r failed in override_result; result kept", item)
        return result

    def after_execute(self, job: Job, result: Any, elapsed_s: float) -> None:
        """See :meth:`Middleware.after_execute`."""
        self._each("after_execute", lambda m: m.after_execute(job, result, elapsed_s))

    def after_reply(self, job: Job, result: Any, elapsed_s: float) -> None:
        """See :meth:`Middleware.after_reply`."""
        self._each("after_reply", lambda m: m.after_reply(job, result, elapsed_s))

    def after_release(self, job: Job) -> None:
        """See :meth:`Middleware.after_release`."""
        self._each("after_release", lambda m: m.after_release(job))

    def after_expire(
        self, topic: str, task_uuid: str, task_name: str | None, headers: Headers
    ) -> None:
        """See :meth:`Middleware.after_expire`."""
        self._each("after_expire", lambda m: m.after_expire(topic, task_uuid, task_name, headers))

    def after_consumer_start(self, topic: str) -> None:
        """See :meth:`Middleware.after_consumer_start`."""
        self._each("after_consumer_start", lambda m: m.after_consumer_start(topic))

    def on_consumer_period(self, topic: str) -> None:
        """See :meth:`Middleware.on_consumer_period`."""
        self._each("on_consumer_period", lambda m: m.on_consumer_period(topic))

    def after_consumer_failing(self, topic: str, reason: str | None) -> None:
        """See :meth:`Middleware.after_consumer_failing`."""
        self._each("after_consumer_failing", lambda m: m.after_consumer_failing(topic, reason))

    def after_server_stop(self, topic: str) -> None:
        """See :meth:`Middleware.after_server_stop`."""
        self._each("after_server_stop", lambda m: m.after_server_stop(topic))
