"""Redis clients for the jobboard: from a URL or TaskFlow's keys, direct or through Sentinel.

``make_client(conf)`` builds the client a :class:`RedisJobBoard` uses, with
TaskFlow 6.5's configuration keys and meaning:

* the client keys of :data:`CLIENT_KEYS` pass through to redis-py, each
  converted (configuration files give strings: ``ssl: "true"``,
  ``health_check_interval: "30"``); a key whose value is ``None`` counts as
  absent (Octavia's defaults carry ``ssl_keyfile: None``...);
* ``sentinel: <service>``: ``host``/``port`` (or the URL's address) name a
  Sentinel, ``sentinel_fallbacks`` more of them (``"host:port"``,
  ``"[::1]:26379"``), ``sentinel_kwargs`` the keyword arguments of the
  connections to the Sentinels (TLS, password); the client asks them for the
  service's master and asks again after a failover (redis-py's
  ``SentinelConnectionPool``). Without ``ssl`` the ``ssl_*`` keys are left
  out there, as in TaskFlow.

flowengine's own connection defaults (text replies, 5 s socket bounds,
RESP2) apply where the configuration does not say otherwise.
Through Sentinel, every write of the board's scripts returns only once a
replica has it (``wait_replicas``, default 1; ``wait_replicas_timeout_s``,
see :mod:`flowengine.utils.redis_replicas`): a failover loses no post,
claim or outcome the board reported done.
``translated(where)`` turns redis-py's errors into flowengine's (an
unreachable server is the recoverable BoardUnavailable; a TLS certificate
that does not verify is a JobFailure naming the cause).
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias
from urllib import parse

import redis
import redis.connection
from redis import backoff, retry
from redis import exceptions as redis_exc
from redis import sentinel as redis_sentinel

from flowengine import exceptions as exc
from flowengine.jobs.backends import safe_url
from flowengine.utils import misc, redis_replicas, redis_utils

try:  # redis-py 7+: its probe for maintenance notifications, off as in TaskFlow
    from redis import maint_notifications
except ImportError:  # older redis-py has no such probe
    maint_notifications = None  # type: ignore[assignment]

__all__ = [
    "CLIENT_KEYS",
    "SENTINEL_PORT",
    "check_certificates",
    "client_kwargs",
    "close_client",
    "describe",
    "make_client",
    "replica_wait",
    "translated",
]

#: The default port of a Redis Sentinel (``host``/``port`` name one with ``sentinel``).
SENTINEL_PORT = 26379
_TRUE_WORDS = frozenset(("1", "t", "true", "on", "y", "yes"))


def _flag(value: Any) -> bool:
    """A yes/no value from a bool or a configuration string (``"true"``, ``"0"``...)."""
    return str(value).strip().lower() in _TRUE_WORDS


#: TaskFlow's client keys and how each value is converted for redis-py.
CLIENT_KEYS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("host", str),
    ("port", int),
    ("db", int),
    ("username", str),
    ("password", str),
    ("encoding", str),
    ("encoding_errors", str),
    ("socket_timeout", float),
    ("socket_connect_timeout", float),
    ("retry_on_timeout", _flag),
    ("health_check_interval", int),
    ("unix_socket_path", str),
    ("ssl", _flag),
    ("ssl_keyfile", str),
    ("ssl_certfile", str),
    ("ssl_cert_reqs", str),
    ("ssl_ca_certs", str),
)

#: What make_client returns: a client made with ``decode_responses=True``,
#: whose replies are text. redis-py's types do not follow ``decode_responses``
#: (its results read as ``bytes | str``), so the board says ``str`` where it reads them.
TextClient: TypeAlias = redis.Redis


def client_kwargs(conf: dict[str, Any]) -> dict[str, Any]:
    """The redis-py keyword arguments the conf's client keys give (converted)."""
    kwargs = {key: convert(conf[key]) for key, convert in CLIENT_KEYS if conf.get(key) is not None}
    if maint_notifications is not None:
        kwargs["maint_notifications_config"] = maint_notifications.MaintNotificationsConfig(
            enabled=False
        )
    return kwargs


def _without_ssl_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    # A plain connection class takes no ssl_* arguments: keep them only with ssl on.
    if "ssl" in kwargs:
        kwargs = {**kwargs, "ssl": _flag(kwargs["ssl"])}
    if kwargs.get("ssl"):
        return kwargs
    return {k: v for k, v in kwargs.items() if not k.startswith("ssl_")}


def _address(entry: Any) -> tuple[str, int]:
    """``(host, port)`` from ``"host:port"``, ``"[v6]:port"`` or a pair."""
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        return str(entry[0]), int(entry[1])
    text = str(entry).strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"sentinel_fallbacks entry {entry!r} is not host:port")
    return host, int(port)


def _url_keys(url: str) -> dict[str, Any]:
    """TaskFlow's client keys a ``redis://`` / ``rediss://`` URL gives."""
    parts = parse.urlsplit(url)
    keys: dict[str, Any] = {
        "host": parts.hostname,
        "port": parts.port,
        "username": parse.unquote(parts.username or "") or None,
        "password": parse.unquote(parts.password or "") or None,
        "db": parts.path.strip("/") or None,
    }
    if parts.scheme == "rediss":
        keys["ssl"] = True
    return {k: v for k, v in keys.items() if v is not None}


def _sentinels(conf: dict[str, Any]) -> list[tuple[str, int]]:
    fallbacks = conf.get("sentinel_fallbacks") or []
    if isinstance(fallbacks, str):  # one from a URL query, or a comma-separated list
        fallbacks = [f for f in fallbacks.split(",") if f.strip()]
    first = (str(conf.get("host") or "localhost"), int(conf.get("port") or SENTINEL_PORT))
    return [first, *(_address(f) for f in fallbacks)]


def describe(conf: dict[str, Any]) -> str:
    """Where the board's server is, for errors and logs (never a password)."""
    if conf.get("sentinel") is not None:
        merged = {**_url_keys(conf["url"]), **conf} if conf.get("url") else conf
        where = ", ".join(f"{h}:{p}" for h, p in _sentinels(merged))
        return f"the master of {conf['sentinel']!r} (Sentinels {where})"
    if conf.get("url"):
        return safe_url(conf["url"])
    return f"{conf.get('host', 'localhost')}:{conf.get('port', 6379)}"


def _through_sentinels(conf: dict[str, Any]) -> TextClient:
    if conf.get("url"):
        conf = {**_url_keys(conf["url"]), **{k: v for k, v in conf.items() if v is not None}}
    if conf.get("unix_socket_path") is not None:
        raise ValueError(
            "unix_socket_path can not be combined with sentinel (Sentinels hand out TCP addresses)"
        )
    sentinels = _sentinels(conf)
    kwargs = _without_ssl_options(client_kwargs(conf))
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    sentinel_kwargs = conf.get("sentinel_kwargs")
    if sentinel_kwargs is not None:
        sentinel_kwargs = _without_ssl_options(dict(sentinel_kwargs))
    # Looked up at call time (not imported by name), as TaskFlow's tests patch it.
    manager = redis_sentinel.Sentinel(  # type: ignore[no-untyped-call]
        sentinels, sentinel_kwargs=sentinel_kwargs, **kwargs
    )
    # The master's connections are made from the manager's connection kwargs
    # when master_for() builds its pool; the Sentinels' clients exist already
    # but connect lazily, so their pools still take the time bounds, and no
    # retries: a Sentinel that does not answer is passed over for the next
    # one at once (redis-py would first retry it with back-off, seconds).
    for key, value in redis_utils.connection_defaults().items():
        manager.connection_kwargs.setdefault(key, value)
    for sentinel_client in manager.sentinels:
        pool_kwargs = sentinel_client.connection_pool.connection_kwargs
        for key, value in redis_utils.socket_defaults().items():
            pool_kwargs.setdefault(key, value)
        pool_kwargs["retry"] = retry.Retry(backoff.NoBackoff(), 0)
    client: TextClient = manager.master_for(conf["sentinel"])  # type: ignore[no-untyped-call]
    return client


def replica_wait(conf: dict[str, Any], where: str) -> redis_replicas.ReplicaWait | None:
    """How many replicas the board's writes wait for: ``wait_replicas`` (1 through Sentinel)."""
    through_sentinel = conf.get("sentinel") is not None
    replicas = int(conf.get("wait_replicas", 1 if through_sentinel else 0))
    if replicas <= 0:
        return None
    return redis_replicas.shared(
        where,
        replicas,
        float(conf.get("wait_replicas_timeout_s", redis_replicas.DEFAULT_TIMEOUT_S)),
    )


def make_client(conf: dict[str, Any]) -> TextClient:
    """A Redis client from a board conf (URL in ``url``, TaskFlow's keys, or Sentinel)."""
    if conf.get("sentinel") is not None:
        return _through_sentinels(conf)
    url = conf.get("url")
    if url:
        # The URL's address wins over host/port; other keys complete it.
        kwargs = {k: v for k, v in client_kwargs(conf).items() if k not in ("host", "port")}
        bare = parse.urlsplit(url)._replace(query="", fragment="").geturl()
        return redis.Redis.from_url(bare, **{**redis_utils.connection_defaults(), **kwargs})
    # Looked up at call time: TaskFlow's tests patch redis_utils.RedisClient.
    return redis_utils.RedisClient(**client_kwargs(conf))


def close_client(client: TextClient) -> None:
    """Close the client's connections, and its Sentinels' if it came from them."""
    client.close()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel_client in getattr(manager, "sentinels", ()):
        sentinel_client.close()


def check_certificates(client: TextClient) -> None:
    """Open one TLS connection to the server, and close it, without redis-py's retries.

    A certificate that does not verify then fails at once (redis-py retries a
    failed connection, then the failed command, with back-off: seconds); any
    other failure is left to the command that follows. Nothing happens for a
    plain connection.
    """
    pool = client.connection_pool
    if not issubclass(pool.connection_class, redis.connection.SSLConnection):
        return
    once = retry.Retry(backoff.NoBackoff(), 0)
    connection = pool.connection_class(**{**pool.connection_kwargs, "retry": once})
    try:
        connection.connect()
    except redis_exc.ConnectionError as e:
        if misc.find_cause(e, ssl.SSLCertVerificationError) is not None:
            raise
    finally:
        connection.disconnect()


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Raise BoardUnavailable / JobFailure (naming ``where``) for redis-py's errors."""
    try:
        yield
    except (redis_exc.ConnectionError, redis_exc.TimeoutError) as e:
        problem = misc.find_cause(e, ssl.SSLCertVerificationError)
        if problem is not None:  # a wrong CA or name does not go away by retrying
            raise exc.JobFailure(
                f"Redis at {where}: TLS certificate verification failed"
                f" ({problem.verify_message or problem.reason}); check ssl_ca_certs (the CA"
                f" that signed the server's certificate) and the host name",
                cause=e,
            ) from e
        hint = ""
        if misc.find_cause(e, ssl.SSLError) is not None:  # may also be a server that went away
            hint = (
                " (TLS: if the server requires client certificates, check ssl_certfile"
                " and ssl_keyfile)"
            )
        raise exc.BoardUnavailable(f"Redis at {where} is unreachable: {e}{hint}", cause=e) from e
    except redis_exc.RedisError as e:
        raise exc.JobFailure(f"Redis at {where} failed: {e}", cause=e) from e
