"""Who may use the dashboard: a bearer token or basic-auth users, from a file or the environment.

Credentials never come from a command-line value (``ps`` shows those to
every user of the machine): ``--token-file``/``--basic-auth-file`` name
files, ``FLOWENGINE_DASHBOARD_TOKEN``/``FLOWENGINE_DASHBOARD_BASIC_AUTH``
hold them. Without credentials the dashboard is read-only (no action is
shown or accepted) and listens on loopback only, unless told
``--insecure-public``. With them, every request for data or an action must
carry them (``Authorization: Bearer <token>`` or ``Basic``), and actions
are allowed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Mapping

#: Environment variables holding the credentials when no file is named.
TOKEN_ENV = "FLOWENGINE_DASHBOARD_TOKEN"
BASIC_AUTH_ENV = "FLOWENGINE_DASHBOARD_BASIC_AUTH"

#: Shortest token accepted (characters): a shorter one can be guessed.
MIN_TOKEN_CHARS = 16

#: Shortest basic-auth password accepted (characters).
MIN_PASSWORD_CHARS = 8

#: Realm named in the basic-auth challenge (browsers show it in their prompt).
REALM = "flowengine dashboard"


class CredentialsError(ValueError):
    """Credentials that cannot be used: a missing or empty file, a too-short token..."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    """The token and basic-auth users allowed in (none of either: no authentication)."""

    token: str | None = None
    #: User name -> password.
    users: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:  # never show a secret, only what kind is set
        return f"Credentials(token={self.token is not None}, users={sorted(self.users)})"

    @property
    def enabled(self) -> bool:
        """Whether any credential is set (then data and actions need them)."""
        return self.token is not None or bool(self.users)

    @property
    def describe(self) -> str:
        """How one logs in, for the start-up line."""
        kinds = (["bearer token"] if self.token is not None else []) + (
            [f"basic auth ({len(self.users)} user(s))"] if self.users else []
        )
        return " or ".join(kinds) or "none"

    def challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401 (basic when users exist: browsers prompt)."""
        if self.users:
            return f'Basic realm="{REALM}", charset="UTF-8"'
        return f'Bearer realm="{REALM}"'

    def who(self, authorization: str) -> str | None:
        """Who an ``Authorization`` header names, for the log (None: not allowed in).

        A token holder is named by a short hash of the token (never the token).
        """
        scheme, _, value = authorization.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and self.token is not None and value:
            if hmac.compare_digest(value.encode(), self.token.encode()):
                return f"token {token_id(self.token)}"
            return None
        if scheme == "basic" and self.users and value:
            try:
                user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            known = self.users.get(user)
            # Compared even for an unknown user: the time taken does not tell who exists.
            expected = (known or "\0" * len(password)).encode()
            if sep and hmac.compare_digest(password.encode(), expected) and known is not None:
                return f"user {user}"
        return None


def token_id(token: str) -> str:
    """A short public name of ``token`` (a hash): who acted, without the secret."""
    return hashlib.sha256(b"flowengine-dashboard\0" + token.encode()).hexdigest()[:8]


def load(
    token_file: str | None, basic_auth_file: str | None, environ: Mapping[str, str] | None = None
) -> Credentials:
    """Credentials from the files named, else the environment; CredentialsError if unusable."""
    env = os.environ if environ is None else environ
    if token_file is not None:
        lines = _read(token_file, "--token-file")
        token: str | None = lines[0]
    else:
        token = env.get(TOKEN_ENV, "").strip() or None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise CredentialsError(
            f"the dashboard token is {len(token)} characters long: use at"
            f" least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 24`)"
        )
    if basic_auth_file is not None:
        entries = _read(basic_auth_file, "--basic-auth-file")
    else:
        entries = [line for line in env.get(BASIC_AUTH_ENV, "").splitlines() if line.strip()]
    users = {}
    for entry in entries:
        user, sep, password = entry.partition(":")
        if not sep or not user:
            raise CredentialsError("basic-auth credentials are lines of user:password; one is not")
        if len(password) < MIN_PASSWORD_CHARS:
            raise CredentialsError(
                f"the password of basic-auth user {user!r} is shorter than"
                f" {MIN_PASSWORD_CHARS} characters"
            )
        users[user] = password
    return Credentials(token, users)


def _read(path: str, option: str) -> list[str]:
    """The non-blank, non-comment lines of a credentials file."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [
                line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")
            ]
    except OSError as e:
        raise CredentialsError(f"{option} {path}: {e.strerror or e}") from e
    if not lines:
        raise CredentialsError(f"{option} {path} holds no credentials")
    return lines


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a --host value) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface
