"""TLS to ZooKeeper: one handshake before kazoo starts, and the server's version over TLS.

kazoo retries a connection that failed its TLS handshake as if the server
were down, until its start timeout, logging the cause at each try: a wrong
CA, a certificate for another name or a client certificate the server
refuses would look like an unreachable ensemble for seconds.
:func:`tls_problem` makes one handshake (with the client's own settings)
first and names such a cause in one line, so the board or the persistence
backend fails at once instead. A host that does not answer at all says
nothing about TLS: the next one is tried, and when none answers kazoo's own
start reports the ensemble unreachable.

kazoo 2.11's ``server_version()`` fails over TLS (its four-letter-word
connection hands the port as the TLS server name): :func:`server_version`
asks with ``srvr`` over a connection made right.
"""

from __future__ import annotations

import re
import ssl
from typing import Any

__all__ = ["PROBE_TIMEOUT_S", "server_version", "tls_problem"]

#: Bound on one probe (connect, handshake, first reply): a server on a LAN
#: answers in milliseconds; one that does not is left to kazoo's retries.
PROBE_TIMEOUT_S = 3.0
#: ZooKeeper answers ``srvr`` (whitelisted by default) with its version:
#: a reply proves the server accepted our certificate; its text is not needed.
_SRVR = b"srvr"
_VERSION = re.compile(r"Zookeeper version:\s*(\d+)\.(\d+)\.(\d+)")


def _open(client: Any, host: str, port: int, timeout_s: float) -> Any:
    return client.handler.create_connection(
        (host, port),
        hostname=host,
        timeout=timeout_s,
        use_ssl=True,
        ca=client.ca,
        certfile=client.certfile,
        keyfile=client.keyfile,
        keyfile_password=client.keyfile_password,
        verify_certs=client.verify_certs,
        check_hostname=client.check_hostname,
    )


def _ask(client: Any, host: str, port: int, command: bytes, timeout_s: float) -> bytes:
    sock = _open(client, host, port, timeout_s)
    try:
        sock.sendall(command)
        reply = b""
        while chunk := sock.recv(4096):  # the server closes after its answer
            reply += chunk
        return reply
    finally:
        sock.close()


def _describe(host: str, port: int, error: ssl.SSLError) -> str:
    where = f"ZooKeeper at {host}:{port}"
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"{where}: TLS certificate verification failed"
            f" ({error.verify_message or error.reason}); check ca (the CA that signed the"
            f" server's certificate) and the host name"
        )
    reason = str(error.reason or error).lower().replace("_", " ")
    if "certificate" in reason:  # the server's alert: it refused ours (or got none)
        return (
            f"{where} refused this client's TLS certificate ({reason}); check certfile"
            f" and keyfile (a certificate signed by a CA the server trusts)"
        )
    return f"{where}: TLS handshake failed ({reason}); is it a TLS port (secureClientPort)?"


def tls_problem(client: Any, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """One line naming why ``client``'s TLS settings cannot work, or None.

    None also when the client does not use TLS, or no host answered (that is
    kazoo's to report). Probes the hosts in order, stopping at the first that
    answers.
    """
    if not client.use_ssl:
        return None
    for host, port in client.hosts:
        try:
            _ask(client, host, port, _SRVR, timeout_s)
        except ssl.SSLError as e:
            return _describe(host, port, e)
        except (OSError, ValueError):
            continue  # down or unreachable: try the next
        return None
    return None


def server_version(client: Any, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, int, int]:
    """The version of the server ``client`` is connected to, asked over TLS with ``srvr``.

    ValueError when the server does not say (``srvr`` not allowed by its
    ``4lw.commands.whitelist``); OSError/ssl.SSLError when it cannot be asked.
    """
    # kazoo keeps the socket of its session here; its peer is the server to ask.
    peer = client._connection._socket.getpeername()
    host = peer[0]
    reply = _ask(client, host, peer[1], _SRVR, timeout_s).decode("utf-8", "replace")
    found = _VERSION.search(reply)
    if found is None:
        first = reply.strip().splitlines()[0] if reply.strip() else "nothing"
        raise ValueError(
            f"ZooKeeper at {host}:{peer[1]} did not tell its version to 'srvr': {first}"
        )
    major, minor, patch = (int(g) for g in found.groups())
    return major, minor, patch
