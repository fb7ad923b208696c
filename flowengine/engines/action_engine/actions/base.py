"""What every action (task or retry) shares: state changes, saving, notifying."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowengine import states

#: Sentinel for "no result given" (None is a valid result).
NO_RESULT: Any = object()

#: States whose change also saves the atom's result (or failure).
SAVE_RESULT_STATES = frozenset(
    (states.SUCCESS, states.FAILURE, states.REVERTED, states.REVERT_FAILURE)
)


class Action:
    """Schedules and completes one kind of atom, keeping storage and listeners told."""

    #: The key naming the atom in notification details ('task_name'/'retry_name').
    name_key = "atom_name"
    uuid_key = "atom_uuid"

    def __init__(
        self,
        storage: Any,
        notifier: Any,
        tracker: Callable[[str, str], Any],
        uuid_of: Callable[[str], str],
        state_of: Callable[[str], str],
        fetch_args: Callable[[str, bool], dict[str, Any]],
    ) -> None:
        self._storage = storage
        self._notifier = notifier
        # tracker(name, new_state) keeps the runtime's view (readiness) current.
        self._track = tracker
        self._uuid_of = uuid_of
        self._state_of = state_of
        # fetch_args(name, revert) -> the arguments for execute (or revert).
        self._fetch_args = fetch_args

    def _notify(self, name: str, state: str, old_state: str, result: Any) -> None:
        if not self._notifier:
            return  # nobody listens: skip building the details (twice per task)
        details = {self.name_key: name, self.uuid_key: self._uuid_of(name), "old_state": old_state}
        if result is not NO_RESULT:
            details["result"] = result
        self._notifier.notify(state, details)

    def change_state(self, atom: Any, state: str, result: Any = NO_RESULT) -> None:
        """Move ``atom`` to ``state`` (saving ``result`` where states carry one)."""
        name = atom.name
        old_state = self._state_of(name)
        if state in SAVE_RESULT_STATES:
            self._storage.save(name, None if result is NO_RESULT else result, state)
        elif state == old_state:
            return  # nothing changed: no write, no notification
        else:
            self._storage.set_atom_state(name, state)
        self._track(name, state)
        self._notify(name, state, old_state, result)
