"""Job details as logs show them: secrets masked, the rest readable.

A job's details often carry credentials for the flow (``store`` values).
``mask_details`` in a board's configuration decides what its log lines and
``str(job)`` show: ``"secrets"`` (default) masks every value whose key looks
like a secret at any depth (a *word* of the key, split at ``_``, ``-``, ``.``
and camelCase, is a secret word: ``db_password`` and ``apiKey`` are masked,
``passenger`` and ``monkey`` are not); ``"all"`` masks every
value but ``flow_uuid``; ``"none"`` shows everything; a list masks exactly
those keys. ``Job.details`` itself is never masked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["MASK", "looks_secret", "mask_secrets", "masker"]

#: What a masked value is replaced with.
MASK = "***"
#: Words that make a key a secret under the default policy (whole words only:
#: matching substrings masked ``passenger`` and ``keyboard``).
_SECRET_WORDS = frozenset(
    {
        "pass",
        "passwd",
        "password",
        "passphrase",
        "pwd",
        "secret",
        "secrets",
        "token",
        "key",
        "apikey",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "private",
        "privatekey",
        "secretkey",
        "accesskey",
        "dsn",
    }
)
#: Where a key splits into words: separators, and lower-to-upper (camelCase).
_WORD_BREAK = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
#: Never masked: how a conductor finds the flow, and harmless to show.
_ALWAYS_SHOWN = frozenset({"flow_uuid"})


def _walk(value: Any, hide: Callable[[str], bool]) -> Any:
    if isinstance(value, dict):
        return {
            k: (
                MASK
                if isinstance(k, str) and k not in _ALWAYS_SHOWN and hide(k)
                else _walk(v, hide)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_walk(v, hide) for v in value]
    return value


def looks_secret(key: str) -> bool:
    """Whether one word of ``key`` names a secret (``db_password``, ``apiKey``, ``X-Auth``)."""
    return any(word.lower() in _SECRET_WORDS for word in _WORD_BREAK.split(key) if word)


def mask_secrets(value: Any) -> Any:
    """``value`` with the value of every secret-looking key masked, at any depth."""
    return _walk(value, looks_secret)


def masker(policy: Any) -> Callable[[Any], Any]:
    """A function masking details under ``policy`` (see the module docstring).

    Raises ValueError naming an unknown policy.
    """
    if policy is None or policy == "secrets":
        return mask_secrets
    if policy == "all":
        return lambda details: (
            {k: (v if k in _ALWAYS_SHOWN else MASK) for k, v in details.items()}
            if isinstance(details, dict)
            else MASK
        )
    if policy in ("none", False):
        return lambda details: details
    if isinstance(policy, str):
        policy = [p.strip() for p in policy.split(",") if p.strip()]
    if isinstance(policy, (list, tuple, set)):
        keys = frozenset(policy)
        return lambda details: _walk(details, keys.__contains__)
    raise ValueError(
        f"jobboard option 'mask_details' must be 'secrets', 'all', 'none' or"
        f" a list of keys, not {policy!r}"
    )
