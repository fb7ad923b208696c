"""Flow-detail bookkeeping: the flow's identity, state and metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowengine import states
from flowengine.storage.base import StorageBase


class FlowDetailMixin(StorageBase):
    """The flow detail's name, uuid, state and metadata."""

    @property
    def flow_name(self) -> str:
        """Name of the flow detail."""
        return self._flowdetail.name

    @property
    def flow_uuid(self) -> str:
        """Uuid of the flow detail."""
        return self._flowdetail.uuid

    @property
    def flow_meta(self) -> dict[str, Any]:
        """Metadata of the flow detail."""
        return self._flowdetail.meta

    def set_flow_state(self, state: str) -> None:
        """Set and persist the flow detail's state."""
        with self._rlock:
            self._flowdetail.state = state
            self._save_flow()

    def get_flow_state(self) -> str:
        """The flow detail's state (PENDING if never set)."""
        return self._flowdetail.state or states.PENDING

    def change_flow_state(self, state: str) -> tuple[bool, str]:
        """Move the flow to ``state`` if allowed: ``(changed, old_state)``; raises InvalidState."""
        with self._rlock:
            old_state = self.get_flow_state()
            if not states.check_flow_transition(old_state, state):
                return False, old_state
            self.set_flow_state(state)
            return True, old_state

    def update_flow_metadata(self, update_with: Mapping[str, Any]) -> None:
        """Merge into the flow detail's metadata and persist it."""
        with self._rlock:
            if update_with:
                self._flowdetail.meta.update(update_with)
                self._save_flow()
