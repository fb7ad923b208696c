"""What went wrong with a broker, said in one line a user can act on.

kombu reports a typo in a URL, a wrong password and a stopped broker as
different exception types from different client libraries (py-amqp, redis-py,
the socket module); a user needs to know which of them it is, and whether
waiting can help. :func:`check_url` catches what is wrong before any
connection; :func:`classify` turns an error met while connecting or
declaring into :class:`~flowengine.exceptions.BrokerConfigError` (waiting
cannot help: fix the configuration) or
:class:`~flowengine.exceptions.BrokerUnavailable` (the broker may come back).
"""

from __future__ import annotations

import re
import socket
import ssl

from kombu.utils.url import maybe_sanitize_url

from flowengine import exceptions as exc
from flowengine.utils import misc

#: AMQP reply codes that mean "what you asked for is configured otherwise".
_PRECONDITION_FAILED = 406
#: AMQP reply codes that mean "these credentials / this vhost are refused".
_ACCESS_REFUSED = 403
_NOT_ALLOWED = 530

#: Words in an error's text by which Redis says a password is wrong or missing.
_REDIS_AUTH_WORDS = (
    "WRONGPASS",
    "NOAUTH",
    "invalid password",
    "invalid username-password",
    "Authentication required",
)

#: OpenSSL's verify codes for "the certificate names another host / IP address".
_HOST_MISMATCH_CODES = (62, 64)

#: How RabbitMQ names the queue whose declaration conflicts ("... for queue 'q' in vhost").
_CONFLICTING_QUEUE = re.compile(r"for queue '([^']*)'")

#: Transports flowengine's messages name when the scheme is unknown.
_KNOWN_SCHEMES = "memory://, filesystem://, redis:// or amqp://"


def check_url(url: str | None) -> None:
    """Raise BrokerConfigError for a URL no transport can mean (e.g. ``redis//host``)."""
    if url is None or "://" in url or ";" in url:
        return  # ';' separates kombu's failover URLs, each checked by kombu
    if "/" in url or "@" in url:
        # kombu would read the whole text as an AMQP host name and retry a
        # DNS lookup of it for ever.
        raise exc.BrokerConfigError(
            f"malformed broker URL {maybe_sanitize_url(url)!r}: expected"
            f" scheme://host[:port]/..., e.g. redis://localhost:6379/0 or"
            f" amqp://guest:guest@localhost:5672//"
        )


def check_shared(url: str | None, transport: str | None, why: str) -> None:
    """Raise BrokerConfigError when the broker is ``memory``, which one process alone sees.

    ``why`` says which other process would need it ("the demo's workers are
    separate processes").
    """
    scheme = transport or (url.split("://", 1)[0] if url and "://" in url else None)
    if scheme in ("memory", "flowengine-memory"):
        raise exc.BrokerConfigError(
            f"memory:// reaches only the process that uses it and {why}: use"
            f" filesystem:// (one machine), redis:// or amqp://"
        )


def unknown_transport(
    url: str | None, transport: str | None, error: BaseException
) -> exc.BrokerConfigError:
    """The error for a transport name or URL scheme kombu does not know."""
    name = transport or (url.split("://", 1)[0] if url and "://" in url else url)
    where = f" in {maybe_sanitize_url(url)}" if url else ""
    return exc.BrokerConfigError(
        f"unknown broker transport {name!r}{where}: use {_KNOWN_SCHEMES} (or the name of"
        f" an installed kombu transport) ({error})"
    )


def _reply_code(error: BaseException) -> int | None:
    code = getattr(error, "reply_code", None)
    if code is None:
        code = getattr(error, "code", None)
    return code if isinstance(code, int) else None


def tls_problem(error: BaseException, uri: str) -> exc.BrokerConfigError | None:
    """One line saying why TLS to ``uri`` failed, or None when ``error`` is not about TLS.

    Waiting cannot help (a certificate does not change by itself), so it is a
    BrokerConfigError: engines fail at once instead of retrying.
    """
    tls = misc.find_cause(error, ssl.SSLError)
    if tls is None:
        return None
    if isinstance(tls, ssl.SSLCertVerificationError):
        why = tls.verify_message or tls.reason or str(tls)
        if tls.verify_code in _HOST_MISMATCH_CODES:
            return exc.BrokerConfigError(
                f"TLS to the broker at {uri} failed: its certificate does not name the host"
                f" connected to ({why}); connect by a name the certificate holds, or set"
                f" the ssl option server_hostname to the one it holds"
            )
        return exc.BrokerConfigError(
            f"TLS to the broker at {uri} failed: its certificate is not trusted ({why});"
            f" check the CA file (ssl option ca_certs)"
        )
    reason = tls.reason or str(tls)
    if isinstance(tls, ssl.SSLEOFError):
        # RabbitMQ (Erlang's TLS) hangs up without an alert on a client that
        # brought no certificate, or one its CA did not sign.
        return exc.BrokerConfigError(
            f"TLS to the broker at {uri} failed: the broker closed the connection during"
            f" the TLS handshake ({tls}); it may require a client certificate its CA"
            f" signed: check the ssl options certfile and keyfile"
        )
    if "CERTIFICATE" in reason.upper() or "UNKNOWN_CA" in reason.upper():
        return exc.BrokerConfigError(
            f"TLS to the broker at {uri} failed: the broker refused the client certificate,"
            f" or got none ({reason}); check the ssl options certfile and keyfile"
        )
    return exc.BrokerConfigError(
        f"TLS to the broker at {uri} failed ({reason}): check the"
        f" URL's scheme and port (amqps:// and the TLS listener)"
        f" and the ssl options"
    )


def classify(
    error: BaseException, uri: str, exchange: str, durable: bool, queue_type: str = "classic"
) -> exc.BrokerConfigError | exc.BrokerUnavailable:
    """The precise error for ``error``, met on ``uri`` while using ``exchange``.

    ``uri`` must already be free of passwords (Proxy keeps it so);
    ``durable`` and ``queue_type`` are this process's settings.
    """
    if isinstance(error, (exc.BrokerConfigError, exc.BrokerUnavailable)):
        return error
    tls = tls_problem(error, uri)
    if tls is not None:
        return tls
    code = _reply_code(error)
    text = str(error)
    if (code == _PRECONDITION_FAILED or "PRECONDITION_FAILED" in text) and "x-queue-type" in text:
        queue = _CONFLICTING_QUEUE.search(text)
        name = repr(queue.group(1)) if queue else "of this process"
        return exc.BrokerConfigError(
            f"queue {name} on {uri} is declared with another queue type than this"
            f" process's queue_type={queue_type!r} ({text}): every process on exchange"
            f" {exchange!r} must use the same queue_type (flowengine worker --queue-type);"
            f" a queue that exists keeps its type: delete it (rabbitmqctl delete_queue)"
            f" to change it"
        )
    if code == _PRECONDITION_FAILED or "PRECONDITION_FAILED" in text:
        return exc.BrokerConfigError(
            f"exchange {exchange!r} on {uri} is declared with other settings than this"
            f" process's ({text}): every process on an exchange must declare it alike; if"
            f" TaskFlow engines or workers share it, use compat='taskflow' (flowengine"
            f" worker --compat taskflow), else give every process the same durable="
            f" (this one: durable={durable})"
        )
    if (
        code in (_ACCESS_REFUSED, _NOT_ALLOWED)
        or any(w in text for w in _REDIS_AUTH_WORDS)
        or type(error).__name__ == "AuthenticationError"
    ):
        return exc.BrokerConfigError(
            f"the broker at {uri} refused the login ({text}): check the user name,"
            f" password and virtual host in the URL"
        )
    if isinstance(error, socket.gaierror):
        return exc.BrokerUnavailable(
            f"cannot reach the broker at {uri}: its host name does not resolve ({text})"
        )
    return exc.BrokerUnavailable(f"cannot reach the broker at {uri}: {text}")
