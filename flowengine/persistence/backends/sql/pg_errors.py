"""PostgreSQL connection errors that no retry fixes (TLS settings), named in one line.

libpq reports a CA that did not sign the server's certificate, a certificate
for another host, a missing ``sslrootcert`` file or a client certificate the
server refused (``clientcert=verify-full`` in ``pg_hba.conf``) as an
``OperationalError`` like a server that is down, in several lines with
SQLAlchemy's background link appended. :func:`tls_problem` recognises them
so the persistence backend and the SQL jobboard fail at once, in one line
naming the key to fix, instead of retrying. :func:`safe_url` masks every
password of a database URL (the user's and ``sslpassword``, the client key's).
"""

from __future__ import annotations

import re
from urllib import parse

__all__ = ["safe_url", "tls_problem"]

# (what libpq says, lower case) -> what to tell the user; first match wins.
_CA_HINT = "check sslrootcert (the CA that signed the server's certificate)"
_CLIENT_HINT = (
    "check sslcert and sslkey (a certificate signed by a CA the server trusts, for this user)"
)
_PROBLEMS: tuple[tuple[str, str], ...] = (
    ("certificate verify failed", f"TLS certificate verification failed; {_CA_HINT}"),
    (
        "does not match host name",
        "TLS: the server's certificate does not name this host; connect by a name it has",
    ),
    ("root certificate file", f"TLS: the CA file cannot be read; {_CA_HINT}"),
    (
        "requires a valid client certificate",
        f"the server refused this client's TLS certificate; {_CLIENT_HINT}",
    ),
    (
        "certificate authentication failed",
        f"the server refused this client's TLS certificate; {_CLIENT_HINT}",
    ),
    (
        "alert certificate required",
        f"the server refused this client's TLS certificate; {_CLIENT_HINT}",
    ),
    ("alert bad certificate", f"the server refused this client's TLS certificate; {_CLIENT_HINT}"),
    ("alert unknown ca", f"the server refused this client's TLS certificate; {_CLIENT_HINT}"),
    ("private key file", f"TLS: the client key cannot be used; {_CLIENT_HINT}"),
    ("certificate file", f"TLS: the client certificate cannot be read; {_CLIENT_HINT}"),
    (
        "server does not support ssl",
        "the server does not speak TLS; use a server with ssl=on or another sslmode",
    ),
    ("no encryption", "the server accepts TLS connections only; set sslmode (verify-full)"),
)
_SECRET_KEYS = re.compile(r"password", re.IGNORECASE)


def _messages(error: BaseException) -> list[str]:
    """The messages of ``error``, of the DBAPI error behind it and of its causes."""
    seen: list[str] = []
    todo: list[BaseException | None] = [error]
    visited: set[int] = set()
    while todo:
        current = todo.pop()
        if current is None or id(current) in visited:
            continue
        visited.add(id(current))
        seen.append(str(current))
        todo += [
            getattr(current, "orig", None),
            getattr(current, "cause", None),
            current.__cause__,
            current.__context__,
        ]
    return seen


def _libpq_detail(message: str) -> str:
    """libpq's own words: the first line after 'failed:', whitespace collapsed."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    detail = first.rsplit("failed:", 1)[-1]
    return " ".join(detail.split())


def tls_problem(error: BaseException) -> str | None:
    """One line naming a TLS setting that cannot work, from a connection ``error``; else None."""
    # The driver's own message first: ours may quote it already.
    for message in reversed(_messages(error)):
        lowered = message.lower()
        for needle, advice in _PROBLEMS:
            if needle in lowered:
                return f"{advice} ({_libpq_detail(message)})"
    return None


def safe_url(url: str) -> str:
    """``url`` with its password and every ``*password*`` query value shown as ``***``."""
    try:
        parts = parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if password:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse.parse_qsl(query, keep_blank_values=True)
        query = parse.urlencode(
            [(k, "***" if _SECRET_KEYS.search(k) else v) for k, v in pairs], safe="/*"
        )
    return parse.urlunsplit(parts._replace(netloc=netloc, query=query))
