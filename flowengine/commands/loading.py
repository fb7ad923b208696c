"""Find a flow from the command line: ``module:factory`` (a function or a flow)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def load_flow(spec: str) -> Any:
    """The flow named by ``module:attr``: ``attr`` called when callable; ValueError if malformed.

    The current directory is importable, as for ``python -m``.
    """
    factory, flow = load_factory(spec)
    return flow if factory is None else factory()


def load_factory(spec: str) -> tuple[Any, Any]:
    """``(factory, None)`` or ``(None, flow)`` for ``module:attr``; ValueError if malformed.

    A flow object (anything with ``iter_links``) is taken as is; any other
    callable is a factory, called by the caller.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected module:flow_factory, got {spec!r}")
    make_cwd_importable()
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if callable(obj) and not hasattr(obj, "iter_links"):
        return obj, None
    return None, obj


def make_cwd_importable() -> None:
    """Let modules in the current directory be imported, as ``python -m`` does."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
