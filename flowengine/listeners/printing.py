"""A listener that prints every transition to stdout or stderr."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterable
from typing import Any

from flowengine.listeners import base


class PrintingListener(base.DumpingListener):
    """Prints task and flow transitions (and failure tracebacks) to stdout or stderr."""

    def __init__(
        self,
        engine: Any,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        stderr: bool = False,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        # Bound now, as TaskFlow does: a later swap of sys.stdout is not followed.
        self._file = sys.stderr if stderr else sys.stdout

    def _dump(self, message: str, *args: Any, **kwargs: Any) -> None:
        print(message % args, file=self._file)
        exc_info = kwargs.get("exc_info")
        if exc_info is not None:
            traceback.print_exception(exc_info[0], exc_info[1], exc_info[2], file=self._file)
