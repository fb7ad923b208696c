"""ZooKeeper client helpers (TaskFlow's ``taskflow.utils.kazoo_utils``, same names).

The ZooKeeper jobboard and persistence backend build their clients here:
:func:`make_client` from a configuration dict (TaskFlow's keys),
:func:`check_compatible` against a server version range,
:func:`checked_commit` for a transaction whose every operation must
succeed, :func:`finalize_client` to stop and close a client. flowengine's
own: :func:`start_or_await` to get a session whether the client is stopped
or reconnecting, :func:`answer_within` to bound a request. Needs the
``zookeeper`` extra (kazoo).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib import parse

from flowengine.utils import kazoo_tls, optional

try:
    from kazoo import client as k_client
    from kazoo import exceptions as k_exc
    from kazoo.protocol.states import KazooState, KeeperState
    from kazoo.retry import KazooRetry
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

from flowengine import exceptions as exc

__all__ = [
    "CONF_TRANSFERS",
    "CONNECTION_RETRY_MAX_DELAY_S",
    "DEFAULT_HOSTS",
    "KazooTransactionException",
    "answer_within",
    "check_compatible",
    "checked_commit",
    "cap_reconnect_backoff",
    "conf_from_url",
    "finalize_client",
    "make_client",
    "parse_hosts",
    "prettify_failures",
    "start_or_await",
]

LOG = logging.getLogger(__name__)

#: Where a client connects when the configuration names no ``hosts`` (TaskFlow's default).
DEFAULT_HOSTS = "localhost:2181"

_TRUE = frozenset({"1", "t", "true", "on", "y", "yes"})


def _flag(value: Any, default: bool) -> bool:
    # Configuration arrives as Python values or as strings from a URL/file.
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


def _same(value: Any, default: Any) -> Any:
    return value


#: Client options read from a configuration: (key, converter, default).
CONF_TRANSFERS: tuple[tuple[str, Callable[[Any, Any], Any], Any], ...] = (
    ("read_only", _flag, False),
    ("randomize_hosts", _flag, False),
    ("keyfile", _same, None),
    ("keyfile_password", _same, None),
    ("certfile", _same, None),
    ("use_ssl", _flag, False),
    ("verify_certs", _flag, True),
)


#: Longest pause (s) between two attempts to reach the ensemble again. kazoo's
#: own ceiling is an hour: after a long outage a conductor would go on
#: waiting for up to that long once ZooKeeper was back, its jobs unclaimed.
CONNECTION_RETRY_MAX_DELAY_S = 10.0


def cap_reconnect_backoff(client: k_client.KazooClient) -> None:
    """Make ``client`` back off reconnecting to CONNECTION_RETRY_MAX_DELAY_S at most.

    Done on the made client rather than by passing ``connection_retry``: the
    client is made with exactly the arguments TaskFlow passes (its tests
    check that call). kazoo copies its connection retry into the connection
    handler as the client is made, so both are capped.
    """
    handler = getattr(client, "_connection", None)
    for retry in (getattr(client, "_conn_retry", None), getattr(handler, "retry_sleeper", None)):
        if isinstance(retry, KazooRetry) and retry.max_delay > CONNECTION_RETRY_MAX_DELAY_S:
            retry.max_delay = CONNECTION_RETRY_MAX_DELAY_S


def parse_hosts(hosts: Any) -> Any:
    """``'h1:p1,h2:p2'`` from a string, a list/set/tuple, or a ``{host: port}`` dict."""
    if isinstance(hosts, str):
        return hosts.strip()
    if isinstance(hosts, dict):
        hosts = [f"{host}:{port}" for host, port in hosts.items()]
    if isinstance(hosts, (list, set, tuple)):
        return ",".join(str(h) for h in hosts)
    return hosts


def make_client(conf: dict[str, Any]) -> k_client.KazooClient:
    """A (not yet started) kazoo client configured by ``conf``.

    Keys: ``hosts`` (string, list or ``{host: port}``; default
    ``localhost:2181``), ``timeout`` (session timeout, seconds),
    ``read_only``, ``randomize_hosts``, ``use_ssl``, ``verify_certs``
    (booleans, strings accepted), ``keyfile``, ``keyfile_password``,
    ``certfile``, ``ca`` (flowengine's: the CA file that signed the
    servers' certificates), ``command_retry``, ``connection_retry``, ``handler``.
    Without ``connection_retry``, reconnecting backs off to 10 s at most
    (:func:`cap_reconnect_backoff`; kazoo's own ceiling is an hour).
    TypeError for hosts that are empty or of another type.
    """
    kwargs: dict[str, Any] = {"logger": LOG}
    for key, convert, default in CONF_TRANSFERS:
        kwargs[key] = convert(conf[key], default) if key in conf else default
    # 'ca' is not one of TaskFlow 6.5's keys (it never hands kazoo a CA, so
    # its TLS clients trust the system's CAs only): the CA file of a private
    # PKI, passed only when given so kazoo sees the call TaskFlow makes.
    for key in ("ca", "command_retry", "connection_retry", "handler"):
        if key in conf:
            kwargs[key] = conf[key]
    hosts = parse_hosts(conf.get("hosts", DEFAULT_HOSTS))
    if not hosts or not isinstance(hosts, str):
        raise TypeError(
            f"Invalid hosts format, expected a non-empty string/list, not"
            f" {hosts!r} ({type(hosts).__name__})"
        )
    kwargs["hosts"] = hosts
    if "timeout" in conf:
        kwargs["timeout"] = float(conf["timeout"])
    client = k_client.KazooClient(**kwargs)
    if "connection_retry" not in conf:
        cap_reconnect_backoff(client)
    return client


def finalize_client(client: k_client.KazooClient) -> None:
    """Stop and close ``client``, whether or not it was started."""
    client.stop()
    client.close()


def start_or_await(client: k_client.KazooClient, timeout_s: float) -> None:
    """Have ``client`` connected within ``timeout_s``: start it if it is not running, else
    wait for it to reconnect. The handler's timeout exception if no session by then.

    kazoo's ``start()`` is for a stopped (or never started) client only. On
    one that runs but is between servers (its node died, an election is
    under way) it first tries to stop it: it stops the client's callback
    threads and joins its connection thread without a bound, and that
    thread, busy reconnecting, never ends, so the call never returns. A
    conductor whose persistence asked for a connection in the second its
    client was reconnecting hung there, its job claimed and never run.
    """
    if client.connected:
        return
    if client.client_state == KeeperState.CLOSED:  # never started, or stopped
        client.start(timeout=timeout_s)
        return
    back = threading.Event()

    def on_state(state: str) -> None:
        if state == KazooState.CONNECTED:
            back.set()

    client.add_listener(on_state)
    try:
        if not client.connected:  # it may have reconnected before the listener was added
            back.wait(timeout_s)
    finally:
        client.remove_listener(on_state)
    if not client.connected:
        raise client.handler.timeout_exception(
            f"ZooKeeper at {client.hosts}: no session within {timeout_s} s (still reconnecting)"
        )


def _version(parts: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(p) for p in parts)


def _dotted(version: Sequence[int]) -> str:
    return ".".join(str(p) for p in version)


def check_compatible(
    client: k_client.KazooClient, min_version: Any = None, max_version: Any = None
) -> None:
    """IncompatibleVersion unless the server's version is within [min, max] (inclusive).

    Versions are sequences of numbers, e.g. ``(3, 4, 0)``; either bound may be None.
    """
    if not min_version and not max_version:
        return
    # kazoo's server_version() fails over TLS (see kazoo_tls): ask another way.
    server = _version(
        kazoo_tls.server_version(client) if client.use_ssl else client.server_version()
    )
    if min_version and server < _version(min_version):
        raise exc.IncompatibleVersion(
            f"Incompatible zookeeper version {_dotted(server)}"
            f" detected, zookeeper >= {_dotted(_version(min_version))}"
            f" required"
        )
    if max_version and server > _version(max_version):
        raise exc.IncompatibleVersion(
            f"Incompatible zookeeper version {_dotted(server)}"
            f" detected, zookeeper <= {_dotted(_version(max_version))}"
            f" required"
        )


def prettify_failures(failures: Sequence[tuple[Any, Any]], limit: int = -1) -> str:
    """``Error@Op(path=..., version=...)`` for each failed operation (no data shown).

    ``limit`` > 0 shows that many and counts the rest.
    """
    shown = []
    for op, result in failures:
        attrs = [f"path={op.path!r}"]
        version = getattr(op, "version", -1)
        if version != -1:
            attrs.append(f"version={version}")
        shown.append(f"{type(result).__name__}@{type(op).__name__}({', '.join(attrs)})")
    if limit <= 0 or len(shown) <= limit:
        return ", ".join(shown)
    return ", ".join(shown[:limit]) + f" and {len(shown) - limit} more..."


class KazooTransactionException(k_exc.KazooException):
    """A checked transaction failed; ``failures`` holds each ``(operation, error)``."""

    def __init__(self, message: str, failures: Iterable[tuple[Any, Any]]) -> None:
        super().__init__(message)
        self._failures = tuple(failures)

    @property
    def failures(self) -> tuple[tuple[Any, Any], ...]:
        """The operations that failed, each with its error."""
        return self._failures


def answer_within(client: k_client.KazooClient, pending: Any, timeout_s: float) -> Any:
    """The answer to ``client``'s request in flight, or OperationTimeoutError after ``timeout_s``.

    kazoo's synchronous calls wait without a bound; a request lost in a
    reconnection would hold its caller for ever. The error counts as a lost
    connection: the request (a commit too) may or may not have been applied.
    """
    try:
        return pending.get(timeout=timeout_s)
    except client.handler.timeout_exception as e:
        raise k_exc.OperationTimeoutError(f"no answer from ZooKeeper within {timeout_s} s") from e


def checked_commit(txn: Any, timeout_s: float | None = None) -> list[Any]:
    """Commit a kazoo transaction; its results, or KazooTransactionException naming what failed.

    kazoo reports a failed multi-operation as exception objects among the
    results instead of raising: this raises them. An empty transaction
    commits nothing and returns ``[]``. With ``timeout_s``, a commit not
    answered within it raises OperationTimeoutError (it may still apply).
    """
    if not txn.operations:
        return []
    if timeout_s is None:
        results = txn.commit()
    else:
        results = answer_within(txn.client, txn.commit_async(), timeout_s)
    failures = [
        (op, r) for op, r in zip(txn.operations, results) if isinstance(r, k_exc.KazooException)
    ]
    expected = len(txn.operations)
    if len(results) != expected:
        raise KazooTransactionException(
            f"Transaction returned {len(results)} results, expected one for each of its"
            f" {expected} operations",
            failures,
        )
    if failures:
        # The operation that failed first, not one of those rolled back with it.
        causes = sorted(failures, key=lambda f: isinstance(f[1], k_exc.RolledBackError))
        raise KazooTransactionException(
            f"Transaction with {expected} operations failed: {prettify_failures(causes, limit=1)}",
            failures,
        )
    return list(results)


def conf_from_url(url: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fill ``hosts``/``path`` (and query options) of ``conf`` from a ``zookeeper://`` URL.

    ``zookeeper://h1:2181,h2:2181/some/path?timeout=5``; keys already in
    ``conf`` win. ``zookeeper:`` or ``zookeeper://`` alone leaves the
    defaults. ValueError for another scheme.
    """
    conf = dict(conf or {})
    scheme, sep, rest = url.partition(":")
    if scheme.lower() != "zookeeper":
        raise ValueError(f"Not a zookeeper:// URL: {url!r}")
    rest = rest[2:] if rest.startswith("//") else rest
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    netloc = netloc.rpartition("@")[2]  # no credentials in hosts (nor in logs)
    if netloc:
        conf.setdefault("hosts", netloc)
    if slash and path.strip("/"):
        conf.setdefault("path", "/" + path.strip("/"))
    for key, values in parse.parse_qs(query).items():
        conf.setdefault(key, values[-1])
    return conf
