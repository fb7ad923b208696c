"""Finds a pluggable class (engine, storage backend, jobboard, conductor) by name.

Each kind has a table of built-in names and an entry point group where other
distributions add theirs. Built-in names are looked up first: that needs no
scan of the installed distributions' metadata, which (with importing
:mod:`importlib.metadata` itself) costs tens of milliseconds that every
process would otherwise pay for its first flow. Entry point groups are read
once a process.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Mapping
from typing import Any

from flowengine import exceptions as exc

__all__ = ["find_class"]

LOG = logging.getLogger(__name__)


@functools.lru_cache(maxsize=16)
def _entry_points(namespace: str) -> dict[str, Any]:
    from importlib import metadata

    try:
        return {ep.name: ep for ep in metadata.entry_points(group=namespace)}
    except Exception as e:  # broken metadata must not hide the built-in names
        LOG.debug("Entry point lookup in %r failed: %s", namespace, e)
        return {}


def find_class(name: str, namespace: str, builtin: Mapping[str, str], what: str) -> Any:
    """The class ``name`` stands for: in ``builtin``, else in entry point group ``namespace``.

    ``builtin`` maps names to ``"module:attribute"`` paths; ``what`` names
    the kind in errors. Raises :class:`~flowengine.exceptions.NotFound` for
    an unknown name or one whose module cannot be imported, and
    :class:`~flowengine.exceptions.MissingExtra` (which names the ``pip
    install`` that fixes it) as it comes.
    """
    target = builtin.get(name)
    if target is None:
        ep = _entry_points(namespace).get(name)
        if ep is None:
            raise exc.NotFound(f"Could not find {what} {name!r} (known: {sorted(builtin)})")
        return ep.load()
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except exc.MissingExtra:
        raise
    except (ImportError, AttributeError) as e:
        raise exc.NotFound(f"Could not find {what} {name!r}: {e}", cause=e) from e
