"""Scheduling and completing retry controllers (run in the engine thread)."""

from __future__ import annotations

from typing import Any

from flowengine import states
from flowengine.engines.action_engine import executor as ex
from flowengine.engines.action_engine.actions import base
from flowengine.types import failure as ft

# Argument names the engine gives retry controllers (TaskFlow's names).
EXECUTE_REVERT_HISTORY = "history"
REVERT_FLOW_FAILURES = "flow_failures"


class RetryAction(base.Action):
    """Moves retry controllers through their states and asks them what to do."""

    name_key = "retry_name"
    uuid_key = "retry_uuid"

    def __init__(
        self,
        storage: Any,
        notifier: Any,
        tracker: Any,
        uuid_of: Any,
        state_of: Any,
        fetch_args: Any,
        retry_executor: ex.SerialRetryExecutor,
    ) -> None:
        super().__init__(storage, notifier, tracker, uuid_of, state_of, fetch_args)
        self._executor = retry_executor

    def _arguments(self, retry: Any, revert: bool = False) -> dict[str, Any]:
        arguments = self._fetch_args(retry.name, revert)
        arguments[EXECUTE_REVERT_HISTORY] = self._storage.get_retry_history(retry.name)
        return arguments

    def change_state(
        self, atom: Any, state: str, result: Any = base.NO_RESULT, progress: float | None = None
    ) -> None:
        """Move a retry to ``state``; a REVERTED retry forgets its history."""
        super().change_state(atom, state, result)
        if state == states.REVERTED:
            self._storage.cleanup_retry_history(atom.name, state)

    def schedule_execution(self, retry: Any) -> ex.OutcomeFuture:
        """Run the retry's execute (with its history) right here."""
        self.change_state(retry, states.RUNNING)
        return self._executor.execute_retry(retry, self._arguments(retry))

    def complete_execution(self, retry: Any, result: Any) -> None:
        """Save what execute returned (appending to the retry's history)."""
        if isinstance(result, ft.Failure):
            self.change_state(retry, states.FAILURE, result=result)
        else:
            self.change_state(retry, states.SUCCESS, result=result)

    def schedule_reversion(self, retry: Any) -> ex.OutcomeFuture:
        """Run the retry's revert (with its history and the flow's failures)."""
        self.change_state(retry, states.REVERTING)
        arguments = self._arguments(retry, revert=True)
        arguments[REVERT_FLOW_FAILURES] = self._storage.get_execute_failures()
        return self._executor.revert_retry(retry, arguments)

    def complete_reversion(self, retry: Any, result: Any) -> None:
        """Save what revert returned."""
        if isinstance(result, ft.Failure):
            self.change_state(retry, states.REVERT_FAILURE, result=result)
        else:
            self.change_state(retry, states.REVERTED, result=result)

    def on_failure(self, retry: Any, atom_name: str, failure: ft.Failure) -> Any:
        """Record ``atom_name``'s failure in the retry's history; return its decision."""
        self._storage.save_retry_failure(retry.name, atom_name, failure)
        return retry.on_failure(**self._arguments(retry))
