"""Signed messages: HMAC-SHA256 over a message's body and its critical properties.

With a shared key configured, every sender signs and every receiver
verifies: a message without a valid signature is refused unread (never
decoded, never run). What is signed is the exact body bytes plus the
properties and headers that decide what a message means or where its answer
goes (``type``, ``correlation_id``, ``reply_to``, ``expires``, ``attempt``),
so none of them can be changed or added by someone without the key.

Several keys may be configured for rotation: the first signs, all verify.
A key is named on the wire by its key id (a short hash of the key, never the
key itself), so a receiver knows which of its keys to check with.

Keys come from (first found): the ``secret`` option, the file named by
``FLOWENGINE_SECRET_FILE`` (one key per line, the signing key first), or
``FLOWENGINE_SECRET`` (one key).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc

#: Environment variable holding one shared key.
SECRET_ENV = "FLOWENGINE_SECRET"
#: Environment variable naming a file of keys (one a line, the signing key first).
SECRET_FILE_ENV = "FLOWENGINE_SECRET_FILE"

#: Header carrying ``v1:<hex HMAC-SHA256>``; DESIGN.md's ``signature``.
HEADER_SIGNATURE = "signature"
#: Header naming the key that made the signature (for rotation).
HEADER_KEY_ID = "signature_key_id"

#: Signature scheme version, first in the signed text and in the header, so a
#: later scheme can be told apart instead of failing as "bad signature".
SCHEME = "v1"

#: Message properties covered by the signature.
SIGNED_PROPERTIES = ("type", "correlation_id", "reply_to")
#: Message headers covered by the signature (flowengine's critical ones).
SIGNED_HEADERS = ("expires", "attempt")

#: Shortest key accepted (bytes): HMAC-SHA256 with less than 128 bits of key
#: gives less protection than its name suggests.
MIN_KEY_BYTES = 16

#: Hex digits of the key id: enough to tell a handful of keys apart, too
#: short to help anyone guess a key.
KEY_ID_HEX_CHARS = 12


def key_id(key: bytes) -> str:
    """Public id of ``key``: a short hash that names it without revealing it."""
    return hashlib.sha256(b"flowengine-key-id\0" + key).hexdigest()[:KEY_ID_HEX_CHARS]


def _as_key(value: str | bytes) -> bytes:
    key = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"A signing key must be at least {MIN_KEY_BYTES} bytes long (got {len(key)})"
        )
    return key


def _canonical(value: Any) -> str:
    """One spelling of a property value on every transport (JSON, sorted keys)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def signed_text(
    body: bytes, properties: Mapping[str, Any], headers: Mapping[str, Any], kid: str
) -> bytes:
    """The bytes a signature covers: scheme, key id, critical fields, then the body."""
    fields = [SCHEME, kid]
    fields += [_canonical(properties.get(name)) for name in SIGNED_PROPERTIES]
    fields += [_canonical(headers.get(name)) for name in SIGNED_HEADERS]
    return "\n".join(fields).encode("utf-8") + b"\n" + body


class Keyring:
    """The shared keys of a deployment: the first signs, every one verifies."""

    def __init__(self, keys: Iterable[str | bytes]) -> None:
        ordered = [_as_key(k) for k in keys]
        if not ordered:
            raise ValueError("A keyring needs at least one key")
        self._signing = ordered[0]
        self._signing_id = key_id(ordered[0])
        self._by_id = {key_id(k): k for k in reversed(ordered)}

    @property
    def signing_key_id(self) -> str:
        """Id of the key used to sign."""
        return self._signing_id

    @property
    def key_ids(self) -> list[str]:
        """Ids of every key accepted when verifying."""
        return sorted(self._by_id)

    def __repr__(self) -> str:  # never show a key, only ids
        return f"Keyring(signing={self._signing_id}, accepted={self.key_ids})"

    def sign(
        self, body: bytes, properties: Mapping[str, Any], headers: Mapping[str, Any]
    ) -> dict[str, str]:
        """Headers to add to a message so receivers can verify it."""
        digest = hmac.new(
            self._signing, signed_text(body, properties, headers, self._signing_id), hashlib.sha256
        ).hexdigest()
        return {HEADER_SIGNATURE: f"{SCHEME}:{digest}", HEADER_KEY_ID: self._signing_id}

    def verify(
        self, body: bytes, properties: Mapping[str, Any], headers: Mapping[str, Any]
    ) -> None:
        """Check a received message's signature; raise UnverifiedMessage saying why."""
        signature = headers.get(HEADER_SIGNATURE)
        kid = headers.get(HEADER_KEY_ID)
        if signature is None:
            raise exc.UnverifiedMessage("it is not signed (signing is required here)")
        if not isinstance(signature, str) or not isinstance(kid, str):
            raise exc.UnverifiedMessage("its signature headers are malformed")
        scheme, _, digest = signature.partition(":")
        if scheme != SCHEME:
            raise exc.UnverifiedMessage(f"unknown signature scheme {scheme[:16]!r}")
        key = self._by_id.get(kid)
        if key is None:
            raise exc.UnverifiedMessage(
                f"it is signed with unknown key id {kid[:32]!r}"
                f" (accepted: {', '.join(self.key_ids)})"
            )
        expected = hmac.new(
            key, signed_text(body, properties, headers, kid), hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(expected, digest):
            raise exc.UnverifiedMessage(
                "its signature does not match its content (forged or altered)"
            )


def read_key_file(path: str) -> list[str]:
    """Keys in a file: one a line; blank lines and lines starting with '#' skipped."""
    with open(path, encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")]


def load_keyring(secret: Any = None, environ: Mapping[str, str] | None = None) -> Keyring | None:
    """The keyring to use, or None when signing is off.

    ``secret`` may be a Keyring, one key (str/bytes), or a list of keys (the
    first signs). Without it the environment is read (see module docs).
    ``secret=False`` turns signing off whatever the environment says.
    Raises ValueError for a key that is too short or a key file without keys.
    """
    if secret is False:
        return None
    if isinstance(secret, Keyring):
        return secret
    if isinstance(secret, (str, bytes)):
        return Keyring([secret])
    if secret is not None:
        return Keyring(list(secret))
    env = os.environ if environ is None else environ
    path = env.get(SECRET_FILE_ENV)
    if path:
        keys = read_key_file(path)
        if not keys:
            raise ValueError(f"Key file {path} (from ${SECRET_FILE_ENV}) holds no key")
        return Keyring(keys)
    value = env.get(SECRET_ENV)
    if value:
        return Keyring([value])
    return None
