"""A task's remote failure, re-raised by the engine as the exception the task raised.

A FAILURE reply carries the exception's type names, message, arguments and
remote traceback as JSON (never pickle). The local engines re-raise a single
task's exception itself; to do the same, the engine rebuilds the exception
object when its class is *already loaded* in the engine's process (the task
module is imported here anyway, builtins always are) and can be built from
the sent arguments. Nothing a reply says makes the engine import a module:
otherwise the failure stays as it came and re-raises as WrappedFailure.
"""

from __future__ import annotations

import builtins
import logging
import sys
from typing import Any

from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)


def _loaded_exception_class(type_name: str) -> type[BaseException] | None:
    """The exception class called ``type_name`` if its module is already imported."""
    module_name, _, class_name = type_name.rpartition(".")
    module: Any = sys.modules.get(module_name) if module_name else builtins
    cls = getattr(module, class_name, None) if module is not None else None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls
    return None


def revive(failure: ft.Failure) -> ft.Failure:
    """``failure`` with its exception object rebuilt, when that is possible and safe."""
    if failure.exc_info is not None:
        return failure
    type_names = list(failure)
    cls = _loaded_exception_class(type_names[0]) if type_names else None
    if cls is None:
        return failure
    try:
        value = cls(*failure.exception_args)
    except Exception:  # a constructor that wants other arguments: keep it wrapped
        LOG.debug("Cannot rebuild %s from its arguments", type_names[0], exc_info=True)
        return failure
    if list(ft.Failure.from_exception(value)) != type_names:
        return failure  # a different class under the same name: not the one raised
    return ft.Failure(
        exc_info=(cls, value, None),
        exception_str=failure.exception_str,
        exc_type_names=type_names,
        exc_args=failure.exception_args,
        traceback_str=failure.traceback_str,
        causes=failure.causes,
    )
