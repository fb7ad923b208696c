"""Logging levels and loggers as TaskFlow names them (``TRACE``/``BLATHER`` below DEBUG).

Code written for TaskFlow logs with ``LOG.trace(...)``; the adapter returned by
:func:`getLogger` adds ``trace`` (and ``blather``) to a standard logger.
"""

from __future__ import annotations

import logging
from typing import Any

#: Level for very chatty diagnostics, below DEBUG (TaskFlow's name for it).
BLATHER = 5
#: The same level under its other TaskFlow name.
TRACE = BLATHER

CRITICAL = logging.CRITICAL
DEBUG = logging.DEBUG
ERROR = logging.ERROR
FATAL = logging.FATAL
INFO = logging.INFO
NOTSET = logging.NOTSET
WARN = logging.WARNING
WARNING = logging.WARNING

logging.addLevelName(TRACE, "TRACE")


class _TracingAdapter(logging.LoggerAdapter[logging.Logger]):
    """A logger with ``trace``/``blather`` methods for the TRACE level."""

    def trace(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log at TRACE (below DEBUG)."""
        self.log(TRACE, msg, *args, **kwargs)

    blather = trace


def getLogger(
    name: str = "flowengine",  # noqa: N802
    extra: Any = None,
) -> logging.LoggerAdapter[logging.Logger]:
    """The logger ``name`` with ``trace()``; ``extra`` as for logging.LoggerAdapter."""
    return _TracingAdapter(logging.getLogger(name), extra or {})
