"""One line saying why TLS to Redis failed, for the transport's ``rediss://`` and Sentinel.

A certificate that does not verify (a wrong CA, a server certificate naming
another host) cannot get better by waiting: it is a BrokerConfigError, and
an engine, a worker or a command fails at once instead of retrying it as an
unreachable server. A handshake the server cut short may be a refused
client certificate or a server going away: it stays BrokerUnavailable, with
a hint. The option names are kombu's and redis-py's ``ssl_*`` (in the URL's
query, or in ``sentinel_kwargs`` for the Sentinels' own TLS).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import redis.connection
from redis import backoff, retry
from redis import exceptions as redis_exc

from flowengine import exceptions as exc
from flowengine.utils import misc

__all__ = ["check_sentinels", "tls_problem"]

#: Bound (s) on the one handshake check_sentinels makes with each Sentinel.
PROBE_TIMEOUT_S = 5.0

#: (host, port, CA file) of Sentinels whose certificate verified in this process.
_VERIFIED: set[tuple[str, int, str]] = set()
_VERIFIED_LOCK = threading.Lock()

#: How redis-py writes a failed verification in an error's text, when the
#: error itself is lost (a Sentinel query lists each Sentinel's failure).
_VERIFY_FAILED = "CERTIFICATE_VERIFY_FAILED"


def tls_problem(
    error: BaseException, where: str, sentinel: bool = False
) -> exc.BrokerConfigError | exc.BrokerUnavailable | None:
    """The error to raise for ``error`` met connecting to Redis at ``where``; None if not TLS.

    ``sentinel``: the master was looked up through Sentinels (their TLS
    options are ``sentinel_kwargs``'s).
    """
    verify = misc.find_cause(error, ssl.SSLCertVerificationError)
    if verify is not None or _VERIFY_FAILED in str(error):
        why = (
            getattr(verify, "verify_message", None) or getattr(verify, "reason", None)
            if verify is not None
            else "see the Sentinels' answers below"
        )
        check = (
            "ssl_ca_certs in sentinel_kwargs (the CA that signed the Sentinels'"
            " certificates; the URL's ssl_ca_certs is the master's)"
            if sentinel
            else "ssl_ca_certs (the CA that signed the server's certificate)"
        )
        detail = "" if verify is not None else f": {error}"
        return exc.BrokerConfigError(
            f"Redis at {where}: TLS certificate verification failed ({why}); check"
            f" {check} and the host name{detail}"
        )
    if misc.find_cause(error, ssl.SSLError) is not None:
        return exc.BrokerUnavailable(
            f"Redis at {where}: the TLS handshake failed ({error}); if the server requires"
            f" client certificates, check ssl_certfile and ssl_keyfile"
        )
    return None


def check_sentinels(
    sentinels: Iterable[tuple[str, int]], sentinel_kwargs: Mapping[str, Any] | None, service: str
) -> None:
    """Raise BrokerConfigError when a Sentinel's TLS certificate does not verify.

    redis-py reports a Sentinel it cannot reach as "no master found", after
    retrying with back-off, and without the cause: so with TLS to the
    Sentinels (``sentinel_kwargs`` with ``ssl``), each is greeted once
    first, without retries. A Sentinel that is down is left to the lookup
    (the others may answer); one that verified is not greeted again.
    """
    options = dict(sentinel_kwargs or {})
    if not options.pop("ssl", False):
        return
    ca = str(options.get("ssl_ca_certs"))
    once = retry.Retry(backoff.NoBackoff(), 0)
    for host, port in sentinels:
        with _VERIFIED_LOCK:
            if (host, port, ca) in _VERIFIED:
                continue
        connection = redis.connection.SSLConnection(
            host=host,
            port=port,
            **{
                "socket_connect_timeout": PROBE_TIMEOUT_S,
                "socket_timeout": PROBE_TIMEOUT_S,
                **options,
                "retry": once,
            },
        )
        try:
            connection.connect()  # type: ignore[no-untyped-call]
        except redis_exc.ConnectionError as e:
            problem = tls_problem(e, f"the Sentinel {host}:{port} of {service!r}", sentinel=True)
            if isinstance(problem, exc.BrokerConfigError):
                raise problem from e
            continue
        finally:
            connection.disconnect()  # type: ignore[no-untyped-call]
        with _VERIFIED_LOCK:
            _VERIFIED.add((host, port, ca))
