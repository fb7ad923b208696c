"""Redis client helpers (TaskFlow's ``taskflow.utils.redis_utils``, the part its users touch).

:class:`RedisClient` is the client TaskFlow's documentation and tests hand
to a Redis jobboard: a ``redis.Redis`` that refuses to be used once closed
(redis-py would silently reconnect), so a board whose client was closed
fails loudly instead of carrying on with a connection nobody owns.
:func:`connection_defaults` is what flowengine gives every jobboard
connection unless the configuration says otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis import exceptions as redis_exc

from flowengine.utils import redis_identity

__all__ = ["SOCKET_TIMEOUT_S", "RedisClient", "connection_defaults", "socket_defaults"]

#: Bound on one command's round trip: a hung server fails the call (and the
#: lease keeper retries) instead of freezing a conductor.
SOCKET_TIMEOUT_S = 5.0

_F = TypeVar("_F", bound=Callable[..., Any])


def _refused_once_closed(method: _F) -> _F:
    @functools.wraps(method)
    def guarded(self: RedisClient, *args: Any, **kwargs: Any) -> Any:
        if self.closed:
            raise redis_exc.ConnectionError("This Redis client has been closed")
        return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]  # same signature as method


def socket_defaults() -> dict[str, Any]:
    """The socket time bounds of a jobboard connection (see SOCKET_TIMEOUT_S)."""
    return {"socket_timeout": SOCKET_TIMEOUT_S, "socket_connect_timeout": SOCKET_TIMEOUT_S}


def connection_defaults() -> dict[str, Any]:
    """Keyword arguments of a jobboard connection: text replies, time bounds, RESP2, identity."""
    return {"decode_responses": True, **socket_defaults(), **redis_identity.connection_kwargs()}


class RedisClient(redis.Redis):
    """A ``redis.Redis`` that raises ``ConnectionError`` on every use after close().

    Unlike TaskFlow's, it decodes replies to text by default
    (``decode_responses=True``), which flowengine's Redis board needs (pass
    ``decode_responses=False`` for bytes), and bounds each command and
    connection attempt by :data:`SOCKET_TIMEOUT_S` unless given
    ``socket_timeout`` / ``socket_connect_timeout``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "connection_pool" not in kwargs:  # a given pool brings its own settings
            for key, value in connection_defaults().items():
                kwargs.setdefault(key, value)
        super().__init__(*args, **kwargs)
        self.closed = False

    def close(self) -> None:
        """Close the connections; any later command raises ConnectionError."""
        self.closed = True
        super().close()

    execute_command = _refused_once_closed(redis.Redis.execute_command)
    pipeline = _refused_once_closed(redis.Redis.pipeline)
    transaction = _refused_once_closed(redis.Redis.transaction)
    pubsub = _refused_once_closed(redis.Redis.pubsub)
