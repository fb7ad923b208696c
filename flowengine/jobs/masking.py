"""Job details as logs show them: secrets masked, the rest readable.

A job's details often carry credentials for the flow (``store`` values).
``mask_details`` in a board's configuration decides what its log lines and
``str(job)`` show: ``"secrets"`` (default) masks every value whose key looks
like a secret (password, token, key...) at any depth; ``"all"`` masks every
value but ``flow_uuid``; ``"none"`` shows everything; a list masks exactly
those keys. ``Job.details`` itself is never masked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["MASK", "masker"]

#: What a masked value is replaced with.
MASK = "***"
#: Key names treated as secrets by the default policy.
_SECRET_KEY = re.compile(r"pass|secret|token|key|credential|auth|cookie|private", re.I)
#: Never masked: how a conductor finds the flow, and harmless to show.
_ALWAYS_SHOWN = frozenset({"flow_uuid"})


def _walk(value: Any, hide: Callable[[str], bool]) -> Any:
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and k not in _ALWAYS_SHOWN and hide(k)
                    else _walk(v, hide)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, hide) for v in value]
    return value


def masker(policy: Any) -> Callable[[Any], Any]:
    """A function masking details under ``policy`` (see the module docstring).

    Raises ValueError naming an unknown policy.
    """
    if policy is None or policy == "secrets":
        return lambda details: _walk(details, lambda k: bool(_SECRET_KEY.search(k)))
    if policy == "all":
        return lambda details: ({k: (v if k in _ALWAYS_SHOWN else MASK)
                                 for k, v in details.items()}
                                if isinstance(details, dict) else MASK)
    if policy in ("none", False):
        return lambda details: details
    if isinstance(policy, str):
        policy = [p.strip() for p in policy.split(",") if p.strip()]
    if isinstance(policy, (list, tuple, set)):
        keys = frozenset(policy)
        return lambda details: _walk(details, keys.__contains__)
    raise ValueError(f"jobboard option 'mask_details' must be 'secrets', 'all', 'none' or"
                     f" a list of keys, not {policy!r}")
