"""What flowengine asks of a kombu transport beyond kombu's own contract.

Any kombu transport works: a proxy uses only kombu's public API with it
(connections, channels, producers, consumers, ack/reject/requeue). A
transport may declare more (as kombu's ``Transport.implements`` declares
heartbeats or asynchronous I/O), in a ``flowengine_implements`` class
attribute holding :class:`Capabilities`; its channels then provide the
methods of :class:`LeasingChannel` that the declared capabilities need.
flowengine's Redis transport declares them all, its memory and filesystem
transports ``private_queues`` (filesystem), kombu's own transports none.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Protocol, runtime_checkable

from kombu.connection import Connection

__all__ = ["NONE", "Capabilities", "LeasingChannel", "capabilities", "channel_capabilities"]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a transport implements beyond kombu's contract (all off by default)."""

    #: Each consumer holds a lease (renewed by a LeaseKeeper, see leases.py);
    #: the messages a consumer took go back to their queue when its lease
    #: lapses, and its private queues are deleted.
    leases: bool = False
    #: Consume each queue on a channel of its own (a blocking transport can
    #: wait on one queue per channel only).
    queue_per_channel: bool = False
    #: ``channel.mark_private(queue)``: the queue belongs to this process and
    #: is deleted with it (when its lease lapses, or its process is gone).
    #: Without leases, closing the channel deletes the queues it marked, and
    #: ``channel.private_kept`` then names those it could not delete.
    private_queues: bool = False
    #: ``channel.capturing()`` and ``channel.settle_with(...)``: a reply is
    #: published and the message it answers acknowledged in one atomic step.
    atomic_settle: bool = False
    #: ``channel.batching()``: publications made inside the block reach the
    #: broker together in one round trip when it ends (in order, all or none).
    batch_publish: bool = False
    #: ``channel.take_in_batches(queue)``: a private queue whose messages may
    #: be handled twice (replies) is taken the cheapest way the transport
    #: has: several messages per round trip, each settled with the next take
    #: (Redis); without a claim file (filesystem).
    batch_take: bool = False


#: The capabilities of a transport that declares none (kombu's own).
NONE = Capabilities()


@runtime_checkable
class LeasingChannel(Protocol):
    """The channel methods a transport's capabilities promise."""

    def mark_private(self, queue: str) -> None:
        """Record ``queue`` as private to this process (``private_queues``)."""

    def capturing(self) -> contextlib.AbstractContextManager[list[Any]]:
        """Collect the pushes publications make instead of sending them (``atomic_settle``)."""

    def settle_with(self, delivery_tag: Any, pushes: Any, client: Any) -> None:
        """Send ``pushes`` and acknowledge ``delivery_tag`` atomically (``atomic_settle``)."""

    def batching(self) -> contextlib.AbstractContextManager[None]:
        """Send the block's publications together when it ends (``batch_publish``)."""

    def take_in_batches(self, queue: str) -> None:
        """Take private ``queue`` several messages at a time, settling lazily (``batch_take``)."""


def capabilities(transport: Any) -> Capabilities:
    """What ``transport`` (a kombu transport class or instance, or a connection) implements."""
    if isinstance(transport, Connection):
        transport = transport.transport
    found = getattr(transport, "flowengine_implements", NONE)
    return found if isinstance(found, Capabilities) else NONE


def channel_capabilities(channel: Any) -> Capabilities:
    """What the transport of ``channel`` implements (NONE for a non-virtual channel)."""
    # A kombu virtual channel's ``connection`` is its Transport; py-amqp's
    # channels have an amqp connection there, which declares nothing.
    return capabilities(getattr(channel, "connection", None))
