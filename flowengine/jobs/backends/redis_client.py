"""Redis clients for the jobboard: from a URL or TaskFlow's keys, errors translated.

``make_client(conf)`` builds the client a :class:`RedisJobBoard` uses;
``translated(where)`` turns redis-py's errors into flowengine's (an
unreachable server is the recoverable BoardUnavailable).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias
from urllib import parse

import redis
from redis import exceptions as redis_exc

from flowengine import exceptions as exc
from flowengine import redis_identity

__all__ = ["SOCKET_TIMEOUT_S", "make_client", "translated"]

#: Bound on one command's round trip: a hung server fails the call (and the
#: lease keeper retries) instead of freezing a conductor.
SOCKET_TIMEOUT_S = 5.0
_TRANSFERS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("host", str), ("port", int), ("db", int), ("username", str), ("password", str),
    ("encoding", str), ("encoding_errors", str), ("socket_timeout", float),
    ("socket_connect_timeout", float), ("unix_socket_path", str),
    ("ssl", lambda v: str(v).lower() in ("1", "true", "yes", "on")), ("ssl_keyfile", str),
    ("ssl_certfile", str), ("ssl_cert_reqs", str), ("ssl_ca_certs", str),
)


#: What :func:`make_client` returns: a client made with ``decode_responses=True``,
#: whose replies are text. redis-py's types do not follow ``decode_responses``
#: (its results read as ``bytes | str``), so the board says ``str`` where it reads them.
TextClient: TypeAlias = redis.Redis


def make_client(conf: dict[str, Any]) -> TextClient:
    """A Redis client from a board conf (URL in ``url``, or TaskFlow's keys)."""
    kwargs: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT_S,
                              "socket_connect_timeout": SOCKET_TIMEOUT_S,
                              "decode_responses": True,
                              **redis_identity.connection_kwargs()}
    url = conf.get("url")
    for key, convert in _TRANSFERS:
        if key in conf and not (url and key in ("host", "port")):
            kwargs[key] = convert(conf[key])
    if url:
        bare = parse.urlsplit(url)._replace(query="", fragment="").geturl()
        return redis.Redis.from_url(bare, **kwargs)
    return redis.Redis(**kwargs)


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Raise BoardUnavailable / JobFailure (naming ``where``) for redis-py's errors."""
    try:
        yield
    except (redis_exc.ConnectionError, redis_exc.TimeoutError) as e:
        raise exc.BoardUnavailable(f"Redis at {where} is unreachable: {e}", cause=e) from e
    except redis_exc.RedisError as e:
        raise exc.JobFailure(f"Redis at {where} failed: {e}", cause=e) from e
