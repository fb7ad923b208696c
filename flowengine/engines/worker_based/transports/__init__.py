"""kombu transports flowengine registers, and how a transport name is chosen.

kombu's own ``memory`` and ``filesystem`` transports poll (1 s by default),
and ``filesystem`` names its files by millisecond, so messages written in the
same millisecond are read out of order and a file can be read half-written;
kombu's ``redis`` transport loses a message taken by a consumer that dies
before recording it (see redis.py); its ``amqp`` transport makes nine system
calls to read one message, and its TLS connections check the server's
certificate but not its host name (see amqp.py). flowengine registers drop-in
subclasses under their own names and uses them whenever ``memory``,
``filesystem``, ``redis`` or ``amqp`` (the default) is asked for through
flowengine. Pass a dotted path (``kombu.transport.redis:Transport``) to get
kombu's originals.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from kombu import transport as kombu_transport
from kombu.connection import Connection

from flowengine import exceptions as exc
from flowengine.engines.worker_based.transports import errors as broker_errors

MEMORY = "flowengine-memory"
FILESYSTEM = "flowengine-filesystem"
REDIS = "flowengine-redis"
SENTINEL = "flowengine-sentinel"
AMQP = "flowengine-amqp"
AMQPS = "flowengine-amqps"

#: kombu transport name (or URL scheme) -> the flowengine transport used instead.
TRANSPORT_OVERRIDES = {
    "memory": MEMORY,
    "filesystem": FILESYSTEM,
    "redis": REDIS,
    "rediss": REDIS,
    "sentinel": SENTINEL,
    "amqp": AMQP,
    "pyamqp": AMQP,
    "amqps": AMQPS,
}

_ALIASES = {
    MEMORY: "flowengine.engines.worker_based.transports.memory:Transport",
    FILESYSTEM: "flowengine.engines.worker_based.transports.filesystem:Transport",
    REDIS: "flowengine.engines.worker_based.transports.redis:Transport",
    SENTINEL: "flowengine.engines.worker_based.transports.redis:SentinelTransport",
    AMQP: "flowengine.engines.worker_based.transports.amqp:Transport",
    AMQPS: "flowengine.engines.worker_based.transports.amqp:SSLTransport",
}


def register() -> None:
    """Make kombu know the flowengine transports by name (idempotent)."""
    for name, path in _ALIASES.items():
        kombu_transport.TRANSPORT_ALIASES.setdefault(name, path)


def resolve(url: str | None, transport: str | None) -> str | None:
    """The transport name to give kombu for this ``url``/``transport`` pair."""
    register()
    if transport is not None:
        return TRANSPORT_OVERRIDES.get(transport, transport)
    if url and "://" in url:
        scheme = url.split("://", 1)[0]
        if "+" not in scheme and scheme in TRANSPORT_OVERRIDES:
            return TRANSPORT_OVERRIDES[scheme]
        return None
    return AMQP  # kombu's default transport for a bare host name (or none)


# ``rediss://`` is flowengine's Redis transport over TLS, ``sentinel://`` the
# same through Redis Sentinel (kombu's spellings, see redis.py).

#: URL schemes whose connections are TLS: without ``ssl_*`` options in the
#: URL, the server's certificate is checked against the system's CAs (kombu
#: would not check it at all).
_TLS_SCHEMES = ("rediss",)


class _Connection(Connection):
    """kombu's Connection, keeping flowengine's transport when it moves to an alternate URL.

    kombu reads the transport afresh from the scheme of the next URL of a
    failover list (``redis://h1;redis://h2``), which would swap the
    transport in use for kombu's own one mid-run.
    """

    def switch(self, conn_str: str) -> None:
        super().switch(conn_str)  # type: ignore[no-untyped-call]
        if "://" in conn_str:
            ours = resolve(conn_str, None)
            if ours is not None:
                self.transport_cls = ours


def _tls_default(url: str | None, kwargs: dict[str, Any]) -> None:
    """Verify the server's certificate on a TLS scheme when nothing else is said."""
    if url and url.split("://", 1)[0] in _TLS_SCHEMES and not kwargs.get("ssl"):
        kwargs["ssl"] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}


def _check_sentinel_options(
    url: str | None, transport: str | None, options: Mapping[str, Any] | None
) -> None:
    """BrokerConfigError for Sentinel without a service name (kombu fails later, vaguely).

    ``options`` None: a connection only looked at (its URI), never connected.
    """
    if (
        options is not None
        and resolve(url, transport) == SENTINEL
        and not options.get("master_name")
    ):
        raise exc.BrokerConfigError(
            "a sentinel:// URL needs the transport option master_name, the service its"
            " Sentinels monitor (e.g. --transport-option master_name=mymaster)"
        )


def connection(
    url: str | None,
    transport: str | None,
    transport_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Connection:
    """A kombu connection (not connected yet) to ``url`` through the transport we use.

    Raises BrokerConfigError for a malformed URL or an unknown transport, at
    once: kombu would read ``redis//host`` as an AMQP host name and retry it
    for ever. ``kwargs`` go to Connection (heartbeat, connect_timeout).
    """
    broker_errors.check_url(url)
    if url is None:
        # kombu warns without a hostname; name the transport instead.
        url = f"{transport}://" if transport and transport.isidentifier() else "localhost"
    _tls_default(url, kwargs)
    _check_sentinel_options(url, transport, transport_options)
    try:
        conn = _Connection(
            url,
            transport=resolve(url, transport),  # type: ignore[no-untyped-call]
            transport_options=transport_options,
            **kwargs,
        )
    except KeyError as e:  # kombu: "No such transport"
        raise broker_errors.unknown_transport(url, transport, e) from e
    if not conn.hostname:
        # memory:// and filesystem:// have no host; kombu would warn about it
        # on every clone (each reconnect).
        conn.hostname = "localhost"
    return conn


def public_uri(uri: str, tls: bool = False) -> str:
    """``uri`` with the scheme the user wrote (``redis://``), not our transport's alias.

    ``tls``: the connection is TLS (``rediss://`` rather than ``redis://``).
    """
    for scheme, ours in TRANSPORT_OVERRIDES.items():
        if uri.startswith(ours + "://"):
            if tls and scheme == "redis":
                scheme = "rediss"
            return scheme + uri[len(ours) :]
    return uri


register()
