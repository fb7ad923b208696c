"""ProxyOptions: what a :class:`~.proxy.Proxy` reads and how its loop calls back, in one value.

A proxy takes TaskFlow's first four arguments (topic, exchange,
type_handlers, on_wait), where the broker is (a BrokerSettings) and one
ProxyOptions for everything else, so that engines, workers and the control
client each say only what differs from the defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from flowengine.engines.worker_based.messaging.consumer import (
    ConsumeOptions,
    LoopObserver,
    QueueSpec,
)
from flowengine.engines.worker_based.messaging.delivery import Delivery
from flowengine.engines.worker_based.messaging.publisher import PUBLISH_TIMEOUT_S

__all__ = ["ProxyOptions"]


@dataclasses.dataclass(frozen=True)
class ProxyOptions:
    """The queues a proxy consumes and the callbacks of its consume loop (immutable).

    Callbacks run in the loop's thread; their errors are logged, never fatal.
    Raises ValueError for a non-positive ``publish_timeout_s``.
    """

    #: The queues the loop reads; None: ``<exchange>_<topic>`` bound with the
    #: topic and ``bindings`` (auto-deleted). A worker gives its topic queue
    #: and its private queue.
    queues: Sequence[QueueSpec] | None = None
    #: Extra routing keys of the default queue (an executor adds the announce key).
    bindings: tuple[str, ...] = ()
    #: A routing key that reaches only this proxy's queues: stop() sends a
    #: wake-up there so the loop ends at once (default: the topic when
    #: ``queues`` is None, none otherwise).
    wake_routing_key: str | None = None
    #: Hears of the consume loop's life: each (re)start, each wait period,
    #: failing and recovering (see LoopObserver).
    observer: LoopObserver | None = None
    #: Called with each message refused and why (see TypeDispatcher).
    on_reject: Callable[[Delivery, str], Any] | None = None
    #: How the consume loop behaves (prefetch, wait period, lease, body limit...).
    consume: ConsumeOptions = ConsumeOptions()
    #: How long publish() keeps retrying an unreachable broker (s).
    publish_timeout_s: float = PUBLISH_TIMEOUT_S
    #: A worker's: waits up to that many seconds for room to take another
    #: message; the loop takes none while it returns False (see Consumer).
    wait_for_room: Callable[[float], bool] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bindings", tuple(self.bindings))
        if self.queues is not None:
            object.__setattr__(self, "queues", tuple(self.queues))
        if not self.publish_timeout_s > 0:
            raise ValueError(f"publish_timeout_s must be > 0, not {self.publish_timeout_s!r}")
