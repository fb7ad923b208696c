"""Incremental readiness: which atoms may execute or revert right now.

Every node of the execution graph (atoms and the flow start/end nodes alike)
keeps two counters, updated only when a neighbour's status flips:

* ``pending[n]``: predecessors not yet *done* (executed successfully or ignored
  with their own predecessors done). An atom whose intention is EXECUTE may run
  when this reaches zero.
* ``unclear[n]``: successors not yet *clear* (never ran, reverted, or ignored,
  with their own successors clear). An atom meant to revert may revert when
  this reaches zero.

Each counter is stored doubled, its lowest bit holding whether the node is
done (clear) itself: one dict per counter instead of two per node state. At
100,000 atoms a name-keyed dict costs 5 MB, so every dict saved lowers the
run's peak memory.

Flow nodes are done/clear exactly when their counter is zero, so they pass
status through without the O(n*m) edges flattening them away would cost. A
state change costs O(degree) plus whatever actually flips, never a rescan of
the graph (TaskFlow rescans every atom after each completion: O(n^2) a run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flowengine import states as st

_DONE_STATES = frozenset((st.SUCCESS, st.IGNORE))
_DONE_INTENTIONS = frozenset((st.EXECUTE, st.IGNORE))
_CLEAR_STATES = frozenset((st.PENDING, st.REVERTED, st.IGNORE))
_REVERT_INTENTIONS = frozenset((st.REVERT, st.RETRY))

EXECUTE = "execute"
REVERT = "revert"


class Analyzer:
    """Tracks per-node counters and collects atoms whose readiness may have changed."""

    def __init__(
        self,
        order: list[str],
        preds: dict[str, tuple[str, ...]],
        succs: dict[str, tuple[str, ...]],
        atom_names: Iterable[str],
        can_transition: Callable[[str, str, str], bool],
    ) -> None:
        self._order = order
        self._preds = preds
        self._succs = succs
        # Flow start/end nodes are few: keep those, not a flag per node.
        atoms = set(atom_names)
        self._flow_nodes = frozenset(n for n in order if n not in atoms)
        self._can = can_transition
        self.state: dict[str, str] = {}
        self.intention: dict[str, str] = {}
        #: 2 * (predecessors not done) + (1 if the node is done).
        self._pending: dict[str, int] = {}
        #: 2 * (successors not clear) + (1 if the node is clear).
        self._unclear: dict[str, int] = {}
        #: Atoms whose readiness may have changed since last collected.
        self.candidates: set[str] = set()
        #: Atoms handed to an executor and not completed yet.
        self.in_flight: set[str] = set()
        #: Every atom in graph order, which is what the candidates are after load().
        self._atoms_in_order = [n for n in order if n not in self._flow_nodes]
        self._all_candidates = False

    # -- status -------------------------------------------------------------

    def load(self, atom_states: Iterable[tuple[str, Any, str]]) -> None:
        """Start over from ``(atom, state, intention)`` triples (e.g. read from storage).

        An iterable, not a mapping: at 100,000 atoms a dict of them would
        add 12 MB to the run's peak for a moment.
        """
        state, intention = self.state, self.intention
        for name, atom_state, atom_intention in atom_states:
            state[name] = atom_state
            intention[name] = atom_intention
        # Status checks inlined, and fresh dicts filled in graph order:
        # this walks every node and edge once per run, and at 100,000 atoms
        # each method call and generator costs more than the lookups.
        order, flow_nodes = self._order, self._flow_nodes
        preds, succs = self._preds, self._succs
        pending: dict[str, int] = {}
        for n in order:
            waiting = 0
            for p in preds[n]:
                if not pending[p] & 1:
                    waiting += 2
            if not waiting and (
                n in flow_nodes or (state[n] in _DONE_STATES and intention[n] in _DONE_INTENTIONS)
            ):
                waiting = 1
            pending[n] = waiting
        unclear: dict[str, int] = {}
        for n in reversed(order):
            blocking = 0
            for s in succs[n]:
                if not unclear[s] & 1:
                    blocking += 2
            if not blocking and (n in flow_nodes or state[n] in _CLEAR_STATES):
                blocking = 1
            unclear[n] = blocking
        self._pending, self._unclear = pending, unclear
        self.in_flight.clear()
        # Every atom is a candidate now, and take_candidates would sort them
        # all into the order they already have here: hand this list out as
        # is instead (whatever is added before it is taken is in it).
        self.candidates = set()
        self._all_candidates = True

    def update(self, name: str, state: str | None = None, intention: str | None = None) -> None:
        """Record an atom's new state and/or intention and propagate what flips."""
        if state is not None:
            self.state[name] = state
        if intention is not None:
            self.intention[name] = intention
        self._propagate(name)

    def _propagate(self, start: str) -> None:
        # Status checks inlined: this runs twice per task (RUNNING, then
        # its outcome) and its cost is all interpreter overhead. A counter
        # below 2 is zero; one crossing zero may flip that node in turn.
        stack = [start]
        candidates = self.candidates
        flow_nodes = self._flow_nodes
        pending, unclear = self._pending, self._unclear
        state, intention = self.state, self.intention
        succs, preds = self._succs, self._preds
        while stack:
            n = stack.pop()
            waiting, blocking = pending[n], unclear[n]
            if n in flow_nodes:
                done = waiting < 2
                clear = blocking < 2
            else:
                candidates.add(n)
                node_state = state[n]
                done = (
                    waiting < 2 and node_state in _DONE_STATES and intention[n] in _DONE_INTENTIONS
                )
                clear = blocking < 2 and node_state in _CLEAR_STATES
            if done != waiting & 1:
                pending[n] = waiting ^ 1
                delta = -2 if done else 2
                for s in succs[n]:
                    before = pending[s]
                    pending[s] = before + delta
                    if before < 2 or before + delta < 2:
                        stack.append(s)
            if clear != blocking & 1:
                unclear[n] = blocking ^ 1
                delta = -2 if clear else 2
                for p in preds[n]:
                    before = unclear[p]
                    unclear[p] = before + delta
                    if before < 2 or before + delta < 2:
                        stack.append(p)

    # -- readiness ----------------------------------------------------------

    def readiness(self, name: str) -> str | None:
        """EXECUTE or REVERT if the atom may start that now, else None."""
        if name in self.in_flight:
            return None
        intention = self.intention[name]
        if intention == st.EXECUTE:
            if self._pending[name] >= 2:
                return None
            state = self.state[name]
            # PENDING -> RUNNING is always allowed (the usual case: no lookup).
            if state == st.PENDING or self._can(name, state, st.RUNNING):
                return EXECUTE
        elif intention in _REVERT_INTENTIONS:
            if self._unclear[name] < 2 and self._can(name, self.state[name], st.REVERTING):
                return REVERT
        return None

    def take_candidates(self, key: Callable[[str], int]) -> list[str]:
        """Pop the atoms to re-examine, in ``key`` order (topological)."""
        if self._all_candidates:
            self._all_candidates = False
            self.candidates = set()
            return list(self._atoms_in_order)
        if not self.candidates:
            return []
        found = (
            sorted(self.candidates, key=key) if len(self.candidates) > 1 else list(self.candidates)
        )
        self.candidates = set()
        return found

    def is_success(self) -> bool:
        """Whether every atom succeeded or was ignored."""
        return all(s == st.SUCCESS or s == st.IGNORE for s in self.state.values())
