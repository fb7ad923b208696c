"""Find and build conductors by kind (TaskFlow's ``taskflow.conductors.backends``).

``fetch('blocking' | 'nonblocking', name, jobboard, persistence=...,
engine=..., engine_options=..., ...)``. Kinds are looked up in the entry
point group ``namespace`` first, then in a built-in table.
"""

from __future__ import annotations

import importlib
import logging
from importlib import metadata
from typing import Any

from flowengine import exceptions as exc

__all__ = ["CONDUCTOR_NAMESPACE", "fetch"]

LOG = logging.getLogger(__name__)

#: Entry point group searched for conductor classes.
CONDUCTOR_NAMESPACE = "flowengine.conductors"

_BUILTIN = {
    "blocking": "flowengine.conductors.backends.impl_blocking:BlockingConductor",
    "nonblocking": "flowengine.conductors.backends.impl_nonblocking:NonBlockingConductor",
}


def fetch(
    kind: str, name: str, jobboard: Any, namespace: str = CONDUCTOR_NAMESPACE, **kwargs: Any
) -> Any:
    """Build a conductor of ``kind`` named ``name`` on ``jobboard``.

    Raises NotFound for an unknown kind, ValueError for bad options.
    """
    LOG.debug("Looking for %r conductor driver in %r", kind, namespace)
    cls = None
    try:
        for ep in metadata.entry_points(group=namespace):
            if ep.name == kind:
                cls = ep.load()
                break
    except Exception as e:  # broken metadata must not hide the built-in kinds
        LOG.debug("Entry point lookup in %r failed: %s", namespace, e)
    if cls is None:
        target = _BUILTIN.get(kind) if namespace == CONDUCTOR_NAMESPACE else None
        if target is None:
            raise exc.NotFound(f"Could not find conductor {kind!r} (known: {sorted(_BUILTIN)})")
        module_name, _, cls_name = target.partition(":")
        cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(name, jobboard, **kwargs)
