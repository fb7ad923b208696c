"""WorkerSettings: every option of a worker beyond TaskFlow's arguments, in one value.

A :class:`~.worker.Worker` takes TaskFlow's arguments (exchange, topic,
tasks, executor, threads_count and the broker's url/transport/options), a
:class:`~..messaging.settings.BrokerSettings` (``broker=``: where the broker
is and how to talk to it) and one :class:`WorkerSettings` (``settings=``:
how this worker behaves). Each option is checked here, once, when the
settings are made: a wrong value fails with a ValueError naming the option,
before any connection is opened.

The loose keywords older code passes (``Worker(..., durable=True,
soft_time_limit=30)``) are still accepted: :func:`split_options` sorts them
into worker settings and broker fields.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import timelimits as tl
from flowengine.engines.worker_based.worker_side import exception_handlers as eh
from flowengine.engines.worker_based.worker_side.middleware import Middleware
from flowengine.engines.worker_based.worker_side.standard_middleware import RequestMetrics

__all__ = ["BROKER_FIELDS", "WorkerSettings", "split_options"]

#: Loose ``Worker(...)`` keywords that describe the broker, not the worker:
#: they go to the worker's BrokerSettings (one place says how every
#: connection of the process behaves), never to WorkerSettings.
BROKER_FIELDS = (
    "durable",
    "secret",
    "compat",
    "max_body_bytes",
    "max_redeliveries",
    "queue_type",
    "failover_strategy",
)


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """How a worker behaves (immutable; checked when made).

    Raises ValueError naming the option for a value that cannot work.
    """

    #: Unique id of this worker (header ``worker_id`` of its messages);
    #: None: a new one (host, pid and a random part).
    worker_id: str | None = None
    #: Publish worker and task events on ``<exchange>.events`` (see
    #: :mod:`..events`); None: the default, off (``events.hooks.EVENTS_BY_DEFAULT``).
    events: bool | None = None
    #: Soft time limit (s) of tasks whose request and class set none: the
    #: task is asked to stop (see :mod:`.timelimits`); None: no limit.
    soft_time_limit: float | None = None
    #: Hard time limit (s) of those tasks: the task's thread or child is
    #: abandoned or killed and a failure sent; None: no limit.
    time_limit: float | None = None
    #: Seconds between two heartbeats of each held request; executors declare
    #: a request lost after a few missed ones (see doc/source/reliability.rst).
    heartbeat_interval: float = lv.HEARTBEAT_INTERVAL_S
    #: Called with each failed request, in order, before the default handler
    #: (see :mod:`.exception_handlers`).
    exception_handlers: tuple[eh.ExceptionHandler, ...] = ()
    #: Log each failed request at WARNING after ``exception_handlers``.
    default_exception_handler: bool = True
    #: Answer ``flowengine inspect``/``control`` on the control queue (see :mod:`.control`).
    control: bool = True
    #: Where requests are counted (see :mod:`flowengine.metrics`); None: nowhere.
    metrics: RequestMetrics | None = None
    #: Your own middleware, called after the built-in ones in this order (see
    #: :mod:`.middleware` and doc/source/workers.rst, "Middleware").
    middleware: tuple[Middleware, ...] = ()

    def __post_init__(self) -> None:
        if self.worker_id is not None and (
            not isinstance(self.worker_id, str) or not self.worker_id.strip()
        ):
            raise ValueError(
                f"worker_id must be a non-empty string or None, not {self.worker_id!r}"
            )
        if self.events is not None:
            object.__setattr__(self, "events", bool(self.events))
        # A soft limit above the hard one is allowed: it just never fires.
        for name in ("soft_time_limit", "time_limit"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 < value < math.inf
            ):
                raise ValueError(
                    f"{name} must be a positive number of seconds or None, not {value!r}"
                )
        object.__setattr__(self, "heartbeat_interval", lv.check_interval(self.heartbeat_interval))
        handlers = tuple(self.exception_handlers)
        for handler in handlers:
            if not callable(handler):
                raise ValueError(f"exception_handlers must be callables, got {handler!r}")
        object.__setattr__(self, "exception_handlers", handlers)
        middleware = tuple(self.middleware)
        for each in middleware:
            if not isinstance(each, Middleware):
                raise ValueError(f"middleware must be Middleware instances, got {each!r}")
        object.__setattr__(self, "middleware", middleware)

    @property
    def time_limits(self) -> tl.TimeLimits:
        """The default time limits of tasks run here (checked)."""
        return tl.make(self.soft_time_limit, self.time_limit)


#: Names WorkerSettings takes, as keywords.
_SETTING_NAMES = tuple(field.name for field in dataclasses.fields(WorkerSettings))


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Sort loose ``Worker(...)`` keywords into (WorkerSettings fields, BrokerSettings fields).

    Raises TypeError naming the keywords that are neither.
    """
    unknown = sorted(set(options) - set(_SETTING_NAMES) - set(BROKER_FIELDS))
    if unknown:
        raise TypeError(
            f"Worker() got unexpected keyword argument(s) {', '.join(unknown)};"
            f" worker options are {', '.join(_SETTING_NAMES)}, broker options"
            f" {', '.join(BROKER_FIELDS)}"
        )
    worker = {k: v for k, v in options.items() if k in _SETTING_NAMES}
    broker = {k: v for k, v in options.items() if k in BROKER_FIELDS}
    # An explicit None meant "the default" for the loose keywords.
    if worker.get("heartbeat_interval", 0) is None:
        del worker["heartbeat_interval"]
    return worker, broker
