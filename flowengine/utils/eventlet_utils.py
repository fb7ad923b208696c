"""Whether eventlet can be used: TaskFlow's ``taskflow.utils.eventlet_utils``.

TaskFlow's examples pick a green executor when ``EVENTLET_AVAILABLE`` is
true and call :func:`check_for_eventlet` before relying on one. eventlet is
not a dependency of flowengine: ``EVENTLET_AVAILABLE`` only says whether it
imports here. As in TaskFlow 6.x, :func:`check_for_eventlet` is deprecated
and warns (``DeprecationWarning``) on every call.
"""

from __future__ import annotations

import importlib
import warnings

__all__ = ["EVENTLET_AVAILABLE", "check_for_eventlet"]


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


#: True when eventlet imports in this interpreter.
EVENTLET_AVAILABLE = _importable("eventlet")


def check_for_eventlet(exc: BaseException | type[BaseException] | None = None) -> None:
    """Raise unless eventlet is available.

    ``exc``: what to raise instead of ``RuntimeError('Eventlet is not
    currently available')`` (an exception or exception class). Returns
    None when eventlet is available.
    """
    warnings.warn(
        "Using function/method 'check_for_eventlet()' is deprecated:"
        " Eventlet support is deprecated.",
        DeprecationWarning,
        stacklevel=2,
    )
    if EVENTLET_AVAILABLE:
        return
    if exc is None:
        raise RuntimeError("Eventlet is not currently available")
    raise exc
