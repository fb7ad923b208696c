"""Signed events: what an event's signature covers, for publisher and receiver alike.

Events are signed with the deployment's keyring (see :mod:`.signing`) when
their sender has one. An event message means only its body (its type,
sender and fields are all in the JSON object), so the signature covers the
exact body bytes and nothing else: the message properties and any other
header are left out on both sides, so a transport that adds or drops one
cannot make a genuine event look forged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowengine.engines.worker_based.wire import signing

#: What the signature covers besides the body: nothing. Shared by both sides
#: so they can never disagree about it.
_NO_FIELDS: Mapping[str, Any] = {}


def sign(keyring: signing.Keyring, body: bytes) -> dict[str, str]:
    """Headers to publish with an event whose encoded body is ``body``."""
    return keyring.sign(body, _NO_FIELDS, _NO_FIELDS)


def verify(keyring: signing.Keyring, body: bytes | str, headers: Mapping[str, Any] | None) -> None:
    """Check a received event's signature.

    Raises :class:`~flowengine.exceptions.UnverifiedMessage` saying why
    (unsigned, unknown key id, malformed, or not matching the body).
    """
    if isinstance(body, str):
        body = body.encode("utf-8")
    headers = headers or {}
    # Only the signature headers are read: no other header is covered.
    carried = {
        name: headers[name]
        for name in (signing.HEADER_SIGNATURE, signing.HEADER_KEY_ID)
        if name in headers
    }
    keyring.verify(body, _NO_FIELDS, carried)
