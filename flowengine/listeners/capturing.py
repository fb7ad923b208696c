"""A listener that records transitions in a list (handy in tests)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flowengine.listeners import base


def _frozen(names: Iterable[str] | None) -> frozenset[str]:
    return frozenset(names) if names else frozenset()


class CaptureListener(base.Listener):
    """Appends ``(kind, state, details)`` for each transition to ``self.values``."""

    #: Kind recorded for flow transitions.
    FLOW = "flow"

    #: Kind recorded for task transitions.
    TASK = "task"

    #: Kind recorded for retry transitions.
    RETRY = "retry"

    def __init__(
        self,
        engine: Any,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        capture_flow: bool = True,
        capture_task: bool = True,
        capture_retry: bool = True,
        skip_tasks: Iterable[str] | None = None,
        skip_retries: Iterable[str] | None = None,
        skip_flows: Iterable[str] | None = None,
        values: list[Any] | None = None,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._capture_flow = capture_flow
        self._capture_task = capture_task
        self._capture_retry = capture_retry
        self._skip_tasks = _frozen(skip_tasks)
        self._skip_retries = _frozen(skip_retries)
        self._skip_flows = _frozen(skip_flows)
        # A caller may pass its own list to keep accumulating into it.
        self.values: list[Any] = [] if values is None else values

    @staticmethod
    def _format_capture(kind: str, state: str, details: dict[str, Any]) -> Any:
        """Build what gets appended to ``values`` (override to change it)."""
        return (kind, state, details)

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        if self._capture_task and details["task_name"] not in self._skip_tasks:
            self.values.append(self._format_capture(self.TASK, state, details))

    def _retry_receiver(self, state: str, details: dict[str, Any]) -> None:
        if self._capture_retry and details["retry_name"] not in self._skip_retries:
            self.values.append(self._format_capture(self.RETRY, state, details))

    def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
        if self._capture_flow and details["flow_name"] not in self._skip_flows:
            self.values.append(self._format_capture(self.FLOW, state, details))
