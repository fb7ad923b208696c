"""One value saying where a broker is and how every connection to it behaves.

Engines, workers, proxies and event publishers of one process all talk to
the same broker the same way, so they share one :class:`BrokerSettings`
instead of each taking a URL, a transport, transport and retry options,
durability, a signing secret and a compatibility mode. It is built once at
the public boundary (engine options, ``Worker(...)``, ``Proxy(...)`` with
TaskFlow's arguments, the command line) and checked there: a combination
that cannot work (``compat='taskflow'`` with ``durable=True`` or signing,
``queue_type='quorum'`` without the durable topology or off RabbitMQ)
fails at construction, not at the first message.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from kombu.connection import Connection
from kombu.utils.url import maybe_sanitize_url

from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging import compat
from flowengine.engines.worker_based.messaging.strikes import DEFAULT_MAX_REDELIVERIES
from flowengine.engines.worker_based.transports import failover, topology
from flowengine.engines.worker_based.wire import names, signing

__all__ = [
    "AMQP_HEARTBEAT_S",
    "BROKER_OPTION_KEYS",
    "TASKFLOW_BROKER_ARGS",
    "BrokerSettings",
    "mask_options",
]

#: AMQP heartbeat (s) negotiated with the broker: a silently dead peer (half
#: open TCP, network partition) is noticed within two periods instead of the
#: OS keepalive's hours; generous enough that a loaded 2-core machine never
#: misses one. Transports without heartbeats ignore it.
AMQP_HEARTBEAT_S = 20.0

#: Engine options (and loose keywords) that describe the broker: a
#: BrokerSettings given as the ``broker`` option stands for all of them.
BROKER_OPTION_KEYS = (
    "url",
    "transport",
    "transport_options",
    "retry_options",
    "durable",
    "secret",
    "compat",
    "max_body_bytes",
    "max_redeliveries",
    "queue_type",
    "failover_strategy",
)

#: TaskFlow's four broker arguments (of its Worker, Server, Proxy, executor).
TASKFLOW_BROKER_ARGS = ("url", "transport", "transport_options", "retry_options")

#: Transport option keys whose values are never shown (banner, logs).
_SECRET_OPTION_WORDS = ("password", "secret", "token", "key")

#: URL schemes served by flowengine's Redis transport (directly, or through Sentinel).
_REDIS_SCHEMES = ("redis", "rediss", "sentinel")

#: URL schemes and transport names that reach RabbitMQ (AMQP 0-9-1), the only
#: broker with quorum queues; no scheme at all is kombu's default, AMQP.
_AMQP_SCHEMES = ("", "amqp", "amqps", "pyamqp", "flowengine-amqp")


def mask_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Copy transport options with values of secret-looking keys replaced by '**'.

    Nested options too (``sentinel_kwargs``' password).
    """
    return {
        key: "**"
        if any(word in str(key).lower() for word in _SECRET_OPTION_WORDS)
        else mask_options(value)
        if isinstance(value, Mapping)
        else value
        for key, value in (options or {}).items()
    }


def _frozen(options: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(options or {}))


@dataclasses.dataclass(frozen=True, repr=False)
class BrokerSettings:
    """Where the broker is and how to talk to it (immutable; shared by a process).

    ``url`` and ``transport`` as kombu takes them (``memory``, ``filesystem``
    and ``redis`` get flowengine's own transports); ``transport_options`` and
    ``retry_options`` as kombu's ``Connection`` and ``ensure_connection``
    take them; ``durable`` selects the durable topology (see
    :mod:`..transports.topology`); ``secret`` the signing keys (see
    :mod:`..wire.signing`: None reads ``FLOWENGINE_SECRET``, False turns
    signing off); ``compat='taskflow'`` declares as TaskFlow does for mixed
    fleets (see :mod:`.compat`); ``heartbeat_s`` the AMQP heartbeat.
    ``max_body_bytes``: a larger message body is refused before it is
    decoded, when received (dead-lettered, and answered with a FAILURE
    naming the limit where it is a request) and when published (None: no
    limit). ``max_redeliveries``: how many times a message may be in hand
    when a consume loop fails before it is dead-lettered unread (see
    :mod:`.strikes`). ``queue_type='quorum'`` declares the durable
    topology's queues as RabbitMQ quorum queues (see
    :mod:`..transports.topology`); ``'classic'`` (default) as classic ones.
    ``failover_strategy``: the order in which the URLs of a failover list
    (``amqp://h1//;amqp://h2//``) are tried, ``'round-robin'`` (default:
    the one that answered last first) or ``'shuffle'`` (see
    :mod:`..transports.failover`).

    Raises ValueError for a combination ``compat`` cannot follow, or a
    ``queue_type`` that is unknown, or quorum without ``durable=True`` or
    off AMQP, or an unknown ``failover_strategy``; and
    BrokerConfigError (from :meth:`connection`) for a malformed URL or an
    unknown transport. Its ``repr`` never shows a password.
    """

    url: str | None = None
    transport: str | None = None
    transport_options: Mapping[str, Any] = dataclasses.field(default_factory=_frozen)
    retry_options: Mapping[str, Any] | None = None
    durable: bool = False
    secret: Any = None
    compat: str | None = None
    heartbeat_s: float = AMQP_HEARTBEAT_S
    max_body_bytes: int | None = names.MAX_BODY_BYTES
    max_redeliveries: int = DEFAULT_MAX_REDELIVERIES
    queue_type: str = topology.CLASSIC
    failover_strategy: str = failover.ROUND_ROBIN

    def __post_init__(self) -> None:
        # Frozen copies: a caller mutating its dict later changes nothing here.
        object.__setattr__(self, "transport_options", _frozen(self.transport_options))
        if self.retry_options is not None:
            object.__setattr__(self, "retry_options", _frozen(self.retry_options))
        object.__setattr__(self, "durable", bool(self.durable))
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise ValueError(
                f"max_body_bytes must be positive or None, not {self.max_body_bytes!r}"
            )
        if self.max_redeliveries < 1:
            raise ValueError(f"max_redeliveries must be at least 1, not {self.max_redeliveries!r}")
        object.__setattr__(
            self,
            "compat",
            compat.check(self.compat, durable=self.durable, signed=self.keyring is not None),
        )
        object.__setattr__(self, "queue_type", self._checked_queue_type())
        if self.failover_strategy not in failover.FAILOVER_STRATEGIES:
            raise ValueError(
                f"failover_strategy must be one of"
                f" {', '.join(failover.FAILOVER_STRATEGIES)}, not"
                f" {self.failover_strategy!r}"
            )

    def _checked_queue_type(self) -> str:
        """``queue_type`` normalised (None: classic); ValueError where it cannot work."""
        queue_type = self.queue_type or topology.CLASSIC
        if queue_type not in topology.QUEUE_TYPES:
            raise ValueError(
                f"queue_type must be one of {', '.join(topology.QUEUE_TYPES)}, not {queue_type!r}"
            )
        if queue_type == topology.QUORUM:
            if not self.durable:
                raise ValueError(
                    "queue_type='quorum' needs the durable topology"
                    " (durable=True, flowengine worker --durable): RabbitMQ's"
                    " quorum queues are always durable"
                )
            if self._scheme not in _AMQP_SCHEMES:
                raise ValueError(
                    f"queue_type='quorum' needs RabbitMQ (an amqp:// or"
                    f" amqps:// URL), not {self._scheme}://: only RabbitMQ has"
                    f" quorum queues"
                )
        return queue_type

    @property
    def _scheme(self) -> str:
        """The transport name or URL scheme (of the first URL of a failover list)."""
        if self.transport:
            return self.transport
        return self.url.split("://", 1)[0] if self.url and "://" in self.url else ""

    @classmethod
    def given(
        cls,
        broker: BrokerSettings | None,
        url: str | None = None,
        transport: str | None = None,
        transport_options: Mapping[str, Any] | None = None,
        retry_options: Mapping[str, Any] | None = None,
        **defaults: Any,
    ) -> BrokerSettings:
        """``broker``, or the settings TaskFlow's loose arguments describe.

        For constructors that take either (TaskFlow's ``url``, ``transport``,
        ``transport_options``, ``retry_options``) or flowengine's ``broker``;
        ``defaults`` are further fields for the loose form (``secret=False``).
        ValueError when both are given.
        """
        if broker is None:
            return cls(url, transport, transport_options or {}, retry_options, **defaults)
        if (url, transport, transport_options, retry_options) != (None, None, None, None):
            raise ValueError(
                "give the broker as broker=BrokerSettings(...) or as url/"
                "transport/transport_options/retry_options, not both"
            )
        return broker

    @classmethod
    def given_keywords(
        cls, owner: str, broker: BrokerSettings | None, keywords: Mapping[str, Any]
    ) -> BrokerSettings:
        """``broker``, or the settings TaskFlow's broker keywords describe.

        For internal classes whose TaskFlow counterparts took ``url``,
        ``transport``, ``transport_options`` and ``retry_options``: those
        are still accepted as keywords. TypeError naming any other keyword
        (``owner`` names the class); ValueError when ``broker`` is also given.
        """
        unknown = sorted(set(keywords) - set(TASKFLOW_BROKER_ARGS))
        if unknown:
            raise TypeError(f"{owner}() got unexpected keyword argument(s) {', '.join(unknown)}")
        return cls.given(broker, **keywords)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> BrokerSettings:
        """The settings engine options (or command-line options) ask for.

        ``broker`` (a BrokerSettings) when given; else reads ``url``,
        ``transport``, ``transport_options``, ``retry_options``, ``durable``,
        ``secret``, ``compat``, ``max_body_bytes``, ``max_redeliveries``,
        ``queue_type`` and ``failover_strategy``; ignores everything else.
        Raises TypeError for a ``broker`` that is no BrokerSettings, and
        ValueError when ``broker`` comes with any of those loose options.
        """
        given = options.get("broker")
        if given is not None:
            if not isinstance(given, BrokerSettings):
                raise TypeError(
                    f"the 'broker' option must be a BrokerSettings, not {type(given).__name__}"
                )
            loose = sorted(key for key in BROKER_OPTION_KEYS if options.get(key) is not None)
            if loose:
                raise ValueError(
                    f"give the broker as the 'broker' option or as the"
                    f" option(s) {', '.join(loose)}, not both"
                )
            return given
        return cls(
            url=options.get("url"),
            transport=options.get("transport"),
            transport_options=options.get("transport_options") or {},
            retry_options=options.get("retry_options"),
            durable=bool(options.get("durable", False)),
            secret=options.get("secret"),
            compat=options.get("compat"),
            max_body_bytes=options.get("max_body_bytes", names.MAX_BODY_BYTES),
            max_redeliveries=options.get("max_redeliveries", DEFAULT_MAX_REDELIVERIES),
            queue_type=options.get("queue_type") or topology.CLASSIC,
            failover_strategy=(options.get("failover_strategy") or failover.ROUND_ROBIN),
        )

    @functools.cached_property
    def keyring(self) -> signing.Keyring | None:
        """The keys messages are signed and verified with (None: signing off).

        Read once: a key file is not read again per message or connection.
        """
        return signing.load_keyring(self.secret)

    @property
    def is_redis(self) -> bool:
        """True when this reaches Redis (flowengine's Redis transport)."""
        return self._scheme in _REDIS_SCHEMES

    def with_transport_options(self, **options: Any) -> BrokerSettings:
        """A copy whose transport options also hold ``options`` (these win)."""
        return dataclasses.replace(self, transport_options={**self.transport_options, **options})

    def connection(
        self, extra_options: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Connection:
        """A new, not yet connected kombu connection (``kwargs`` go to kombu).

        ``extra_options`` are added to (and win over) the transport options
        for this connection only: a consumer's lease, a publisher's confirms.
        """
        kwargs.setdefault("heartbeat", self.heartbeat_s)
        kwargs.setdefault("failover_strategy", self.failover_strategy)
        return transports.connection(
            self.url, self.transport, {**self.transport_options, **(extra_options or {})}, **kwargs
        )

    @functools.cached_property
    def public_uri(self) -> str:
        """The broker's URI without its password, with the scheme the user wrote.

        Every URL of a failover list, ``;``-separated.

        Worked out once (from a kombu connection object, no I/O): every
        publisher and consumer of an engine asks for it when made.
        """
        conn = transports.connection(self.url, self.transport)
        if len(conn.alt or ()) > 1:
            # A failover list: every node, each without its password (kombu's
            # own URI names the first node only).
            return ";".join(maybe_sanitize_url(url) for url in conn.alt)
        # kombu writes ``:**@`` even where there is no password (redis://:**@h):
        # that reads as a hidden secret, so a password-less URL is shown as is.
        # (The full URI is the one to look at: kombu fills in defaults, guest's.)
        full = conn.as_uri(include_password=True)
        try:
            has_password = bool(urlsplit(full.partition(";")[0]).password)
        except ValueError:
            has_password = True
        return transports.public_uri(
            conn.as_uri(include_password=not has_password), tls=bool(conn.ssl)
        )

    def __repr__(self) -> str:
        return (
            f"BrokerSettings({self.public_uri!r}, transport={self.transport!r},"
            f" transport_options={mask_options(self.transport_options)!r},"
            f" durable={self.durable}, signed={self.keyring is not None},"
            f" compat={self.compat!r}, queue_type={self.queue_type!r})"
        )
