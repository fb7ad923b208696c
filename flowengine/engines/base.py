"""The interface every engine (serial, parallel, worker-based) offers."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flowengine.types.notifier import Notifier

if TYPE_CHECKING:
    import flowengine.flow
    from flowengine.persistence.base import Backend
    from flowengine.persistence.models import FlowDetail
    from flowengine.storage import Storage
    from flowengine.task import BaseTask


class Engine(abc.ABC):
    """Runs one flow; its storage, notifiers and options are public."""

    # flowengine.flow.Flow in full: several patterns have a class named Flow,
    # and the API docs must link this one.
    def __init__(
        self,
        flow: flowengine.flow.Flow | BaseTask,
        flow_detail: FlowDetail,
        backend: Backend | None,
        options: Mapping[str, Any] | None,
    ) -> None:
        self._flow = flow
        self._flow_detail = flow_detail
        self._backend = backend
        self._options = dict(options or {})
        self._notifier = Notifier()
        self._atom_notifier = Notifier()

    @property
    def notifier(self) -> Notifier:
        """Notifier for flow state changes (details: flow_name, flow_uuid, old_state)."""
        return self._notifier

    @property
    def atom_notifier(self) -> Notifier:
        """Notifier for task and retry state changes (and task progress)."""
        return self._atom_notifier

    @property
    def options(self) -> dict[str, Any]:
        """The options this engine was created with."""
        return self._options

    @property
    @abc.abstractmethod
    def storage(self) -> Storage:
        """The storage unit holding this engine's flow state and results."""

    @property
    @abc.abstractmethod
    def statistics(self) -> dict[str, Any]:
        """Statistics of the last run (timings, counts)."""

    @abc.abstractmethod
    def compile(self) -> None:
        """Compile the flow into what the engine runs (raises on bad flows)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Reset every atom (and the flow) to PENDING."""

    @abc.abstractmethod
    def validate(self) -> None:
        """Check every atom's requirements can be satisfied (MissingDependencies)."""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Make sure storage knows every atom (and its injected arguments)."""

    @abc.abstractmethod
    def run(self) -> None:
        """Run the flow to completion (re-raising the failure that stopped it)."""

    @abc.abstractmethod
    def suspend(self) -> None:
        """Ask the engine to stop starting atoms; those running finish."""
