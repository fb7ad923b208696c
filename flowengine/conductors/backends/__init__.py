"""Find and build conductors by kind (TaskFlow's ``taskflow.conductors.backends``).

``fetch('blocking' | 'nonblocking', name, jobboard, persistence=...,
engine=..., engine_options=..., ...)``. Kinds are looked up in the entry
point group ``namespace`` first, then in a built-in table.
"""

from __future__ import annotations

import logging
from typing import Any

from flowengine.utils import plugins

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
    builtin = _BUILTIN if namespace == CONDUCTOR_NAMESPACE else {}
    cls = plugins.find_class(kind, namespace, builtin, "conductor")
    return cls(name, jobboard, **kwargs)
