"""Redis client helpers (TaskFlow's ``taskflow.utils.redis_utils``, the part its users touch).

:class:`RedisClient` is the client TaskFlow's documentation and tests hand
to a Redis jobboard: a ``redis.Redis`` that refuses to be used once closed
(redis-py would silently reconnect), so a board whose client was closed
fails loudly instead of carrying on with a connection nobody owns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis import exceptions as redis_exc

__all__ = ["RedisClient"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _refused_once_closed(method: _F) -> _F:
    @functools.wraps(method)
    def guarded(self: RedisClient, *args: Any, **kwargs: Any) -> Any:
        if self.closed:
            raise redis_exc.ConnectionError("This Redis client has been closed")
        return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]  # same signature as method


class RedisClient(redis.Redis):
    """A ``redis.Redis`` that raises ``ConnectionError`` on every use after close().

    Unlike TaskFlow's, it decodes replies to text by default
    (``decode_responses=True``), which flowengine's Redis board needs; pass
    ``decode_responses=False`` for bytes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("decode_responses", True)
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
