"""Message objects that kombu builds without ever raising.

kombu turns what the broker delivered into a message object *before* any
handler of ours runs (``channel.Message(raw, channel=...)``, in
``drain_events``): it reads the headers as a mapping, decompresses the body
when a ``compression`` header asks for it, and (virtual transports) decodes
the envelope. Headers that are not a mapping, or a body that is not what
its ``compression`` header claims, made that step raise inside the consume
loop, where the message was given back unsettled and taken again for ever.

:func:`guard` makes a channel build messages that record such a problem in
``message.errors`` (kombu's own field for it) instead of raising, so the
message reaches the consumer's ``on_decode_error`` with its delivery tag,
and is settled there once (dead-lettered, see :mod:`.dead_letters`).

It also refuses compressed bodies unread: every flowengine and TaskFlow
peer sends plain JSON, and decompressing what anybody sends would let one
small message expand to gigabytes before a size limit could look at it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from flowengine import exceptions as exc

__all__ = ["guard"]


def guard(channel: Any) -> None:
    """Make ``channel`` build its messages with :func:`guarded_class` of its own class."""
    base = type(channel).Message
    channel.Message = guarded_class(base)


@functools.cache
def guarded_class(base: type) -> type:
    """A subclass of kombu message class ``base`` whose construction never raises."""

    class GuardedMessage(base):  # type: ignore[misc]
        __doc__ = f"{base.__qualname__} that records construction problems in ``errors``."

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                super().__init__(*args, **kwargs)
            except Exception as e:
                _salvage(self, e, args[0] if args else None, kwargs.get("channel"))

        @property
        def headers(self) -> dict[str, Any]:
            return self.__dict__.get("_guarded_headers") or {}

        @headers.setter
        def headers(self, value: Any) -> None:
            if value is None:
                value = {}
            if not isinstance(value, dict):
                _refuse(self, f"its headers are a {type(value).__name__}, not a mapping")
                self.__dict__["refused_headers"] = value  # kept for its dead letter
                value = {}
            elif value.get("compression") is not None:
                # Recorded before kombu's __init__ reads the header: it then
                # skips decompressing (it does not on a message with errors).
                _refuse(
                    self,
                    f"its body is compressed ({value['compression']!r}); flowengine"
                    " accepts uncompressed JSON only",
                )
            self.__dict__["_guarded_headers"] = value

    GuardedMessage.__name__ = GuardedMessage.__qualname__ = f"Guarded{base.__name__}"
    return GuardedMessage


def _refuse(message: Any, reason: str) -> None:
    """Record ``reason`` as the message's first error (kombu re-raises it to on_decode_error)."""
    try:
        raise exc.MessageRefused(reason)
    except exc.MessageRefused:
        if message.errors is None:
            message.errors = []
        message.errors.append(sys.exc_info())


def _salvage(message: Any, error: Exception, raw: Any, channel: Any) -> None:
    """Fill in what can be read of a message kombu could not build; re-raise if not even its tag.

    Without a delivery tag nothing could settle it; the transport's own
    reader deals with such an item (flowengine's Redis transport drops an
    undecodable envelope, see ``transports/redis.py``).
    """
    body, properties, tag = _raw_parts(raw)
    if tag is None:
        raise error
    message.errors = [(type(error), error, error.__traceback__)]
    message.channel = channel
    message.delivery_tag = tag
    message.content_type = properties.get("content_type") or properties.get("content-type")
    message.content_encoding = properties.get("content_encoding")
    message.delivery_info = {}
    message.headers = {}
    message.properties = properties
    message.body = body
    message.accept = None
    message._decoded_cache = None
    message._state = "RECEIVED"


def _raw_parts(raw: Any) -> tuple[Any, dict[str, Any], Any]:
    """(body, properties, delivery tag) of a virtual payload or of a py-amqp message."""
    if isinstance(raw, dict):  # kombu's virtual transports (memory, filesystem, Redis)
        properties = raw.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        return raw.get("body"), properties, properties.get("delivery_tag")
    info = getattr(raw, "delivery_info", None) or {}
    properties = getattr(raw, "properties", None)
    return (
        getattr(raw, "body", None),
        properties if isinstance(properties, dict) else {},
        info.get("delivery_tag"),
    )
