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
done (clear) itself. Counters, neighbours and flags are lists indexed by the
node's position in the graph order, not dicts keyed by name: at 100,000
nodes the lists stay a few hundred kilobytes each, which the CPU caches
hold, where every lookup by name touched the name, a dict slot and the value
in different places of a heap of hundreds of megabytes.

Flow nodes are done/clear exactly when their counter is zero, so they pass
status through without the O(n*m) edges flattening them away would cost. A
state change costs O(degree) plus whatever actually flips, never a rescan of
the graph (TaskFlow rescans every atom after each completion: O(n^2) a run).
"""

from __future__ import annotations

import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from flowengine import states as st
from flowengine.engines.action_engine import topology as topo

_DONE_STATES = frozenset((st.SUCCESS, st.IGNORE))
_DONE_INTENTIONS = frozenset((st.EXECUTE, st.IGNORE))
_CLEAR_STATES = frozenset((st.PENDING, st.REVERTED, st.IGNORE))
_REVERT_INTENTIONS = frozenset((st.REVERT, st.RETRY))

EXECUTE = "execute"
REVERT = "revert"

#: The state and intention of a node that is no atom, or of an atom not loaded yet.
_UNKNOWN: Any = object()


#: Bits of a node's flags (one small int per node, see Analyzer._flags).
_ATOM = 4  # an atom (not a flow start/end node): a candidate when it changes
_SELF_DONE = 1  # done once its predecessors are (flow nodes: always)
_SELF_CLEAR = 2  # clear once its successors are (flow nodes: always)
_FLOW_FLAGS = _SELF_DONE | _SELF_CLEAR
_INTENT_EXECUTE = 8  # an atom meant to execute
_INTENT_REVERT = 16  # an atom meant to revert (or to retry)
_STATE_PENDING = 32  # an atom in PENDING (to RUNNING needs no check)


def _heads_of(at: array.array[int]) -> array.array[int]:
    """For flat runs' starts ``at``: the node each entry of the flat array belongs to."""
    owners = array.array("q")
    for i in range(len(at) - 1):
        owners.extend(array.array("q", [i]) * (at[i + 1] - at[i]))
    return owners


def _atom_flags(state: str, intention: str) -> int:
    flags = _ATOM
    if intention == st.EXECUTE:
        flags |= _INTENT_EXECUTE
    elif intention in _REVERT_INTENTIONS:
        flags |= _INTENT_REVERT
    if state == st.PENDING:
        flags |= _STATE_PENDING
    if state in _DONE_STATES and intention in _DONE_INTENTIONS:
        flags |= _SELF_DONE
    if state in _CLEAR_STATES:
        flags |= _SELF_CLEAR
    return flags


class Analyzer:
    """Tracks per-node counters and collects atoms whose readiness may have changed.

    Nodes are numbered by their position in ``order`` (a topological order),
    and the counters, flags and neighbours the propagation walks are lists
    indexed by that number: at 100,000 nodes a lookup by name in a dict per
    counter misses the CPU caches several times (the name's hash, the dict's
    slot, the value), a list slot once (issue 38). Each atom's state and
    intention are lists by number too (:meth:`state_of`, :meth:`intention_of`
    for a name): the one table by name is ``index``, which the runtime fills
    in the order atoms start in.
    """

    def __init__(
        self,
        order: list[str],
        successors: topo.Runs,
        atom_ids: list[int],
        can_transition: Callable[[str, str, str], bool],
        index: Mapping[str, int],
    ) -> None:
        """``order``: every node, topologically sorted; ``index``: name -> position in it.

        ``successors``: each node's successors by position, as flat runs
        (node i's are ``flat[at[i]:at[i + 1]]``, see :class:`~.topology.Topology`);
        ``atom_ids``: the positions of the atoms, ascending.
        """
        self._order = order
        self._index = index
        # Neighbours by number, each side one flat array of numbers and one
        # of where each node's run starts: contiguous, and no object per
        # node for the collector to track (issue 38). Handed over as numbers
        # by the topology: no name looked up per edge.
        succ, succ_at = successors
        self._succ, self._succ_at = succ, succ_at
        self._pred, self._pred_at = topo.grouped(succ, _heads_of(succ_at), len(order))
        self._atom_ids = atom_ids
        self._can = can_transition
        # Each atom's state and intention by position, not dicts by name:
        # read and written next to its counters and flags (issue 38).
        # Flow nodes (and atoms not loaded yet) hold _UNKNOWN.
        self._state: list[Any] = [_UNKNOWN] * len(order)
        self._intention: list[Any] = [_UNKNOWN] * len(order)
        #: Per node: _ATOM, and whether its own state makes it done/clear.
        self._flags: list[int] = [_FLOW_FLAGS] * len(order)
        for i in self._atom_ids:
            self._flags[i] = _ATOM  # until load() reads its state
        #: Per node: 2 * (predecessors not done) + (1 if the node is done).
        self._pending: list[int] = []
        #: Per node: 2 * (successors not clear) + (1 if the node is clear).
        self._unclear: list[int] = []
        #: Numbers of the atoms whose readiness may have changed since last collected.
        self._candidates: set[int] = set()
        #: Atoms handed to an executor and not completed yet.
        self.in_flight: set[str] = set()
        self._all_candidates = False

    # -- status -------------------------------------------------------------

    def load(self, atom_states: Iterable[tuple[str, Any, str]]) -> None:
        """Start over from ``(atom, state, intention)`` triples (e.g. read from storage).

        An iterable, not a mapping: at 100,000 atoms a dict of them would
        add 12 MB to the run's peak for a moment.
        """
        state, intention, flags = self._state, self._intention, self._flags
        index = self._index
        for name, atom_state, atom_intention in atom_states:
            i = index[name]
            state[i] = atom_state
            intention[i] = atom_intention
            flags[i] = _atom_flags(atom_state, atom_intention)
        # Fresh lists filled in graph order: this walks every node and
        # edge once per run, with the status checks inlined.
        n_nodes = len(self._order)
        pred, pred_at, succ, succ_at = self._pred, self._pred_at, self._succ, self._succ_at
        pending = [0] * n_nodes
        for i in range(n_nodes):
            waiting = 0
            for p in pred[pred_at[i] : pred_at[i + 1]]:
                if not pending[p] & 1:
                    waiting += 2
            if not waiting and flags[i] & _SELF_DONE:
                waiting = 1
            pending[i] = waiting
        unclear = [0] * n_nodes
        for i in range(n_nodes - 1, -1, -1):
            blocking = 0
            for s in succ[succ_at[i] : succ_at[i + 1]]:
                if not unclear[s] & 1:
                    blocking += 2
            if not blocking and flags[i] & _SELF_CLEAR:
                blocking = 1
            unclear[i] = blocking
        self._pending, self._unclear = pending, unclear
        self.in_flight.clear()
        # Every atom is a candidate now, in graph order: take_candidates
        # hands them all out (whatever is added before it is taken is in it).
        self._candidates = set()
        self._all_candidates = True

    def update(self, name: str, state: str | None = None, intention: str | None = None) -> None:
        """Record an atom's new state and/or intention and propagate what flips."""
        i = self._index[name]
        if state is not None:
            self._state[i] = state
        else:
            state = self._state[i]
        if intention is not None:
            self._intention[i] = intention
        else:
            intention = self._intention[i]
        self._flags[i] = _atom_flags(state, intention)
        self._propagate(i)

    def state_of(self, name: str) -> str:
        """The atom's state (KeyError for an unknown name)."""
        state: str = self._state[self._index[name]]
        if state is _UNKNOWN:
            raise KeyError(name)
        return state

    def intention_of(self, name: str) -> str:
        """The atom's intention (KeyError for an unknown name)."""
        intention: str = self._intention[self._index[name]]
        if intention is _UNKNOWN:
            raise KeyError(name)
        return intention

    def atom_states(self) -> Iterator[tuple[str, str]]:
        """``(atom, state)`` of every loaded atom, in graph order."""
        order, state = self._order, self._state
        for i in self._atom_ids:
            if state[i] is not _UNKNOWN:
                yield order[i], state[i]

    def _propagate(self, start: int) -> None:
        # Status checks inlined: this runs twice per task (RUNNING, then
        # its outcome) and its cost is all interpreter overhead. A counter
        # below 2 is zero; one crossing zero may flip that node in turn.
        stack = [start]
        candidates = self._candidates
        flags = self._flags
        pending, unclear = self._pending, self._unclear
        pred, pred_at, succ, succ_at = self._pred, self._pred_at, self._succ, self._succ_at
        while stack:
            n = stack.pop()
            waiting, blocking, own = pending[n], unclear[n], flags[n]
            if own & _ATOM:
                candidates.add(n)
            done = waiting < 2 and own & _SELF_DONE != 0
            clear = blocking < 2 and own & _SELF_CLEAR != 0
            if done != waiting & 1:
                pending[n] = waiting ^ 1
                delta = -2 if done else 2
                for s in succ[succ_at[n] : succ_at[n + 1]]:
                    before = pending[s]
                    pending[s] = before + delta
                    if before < 2 or before + delta < 2:
                        stack.append(s)
            if clear != blocking & 1:
                unclear[n] = blocking ^ 1
                delta = -2 if clear else 2
                for p in pred[pred_at[n] : pred_at[n + 1]]:
                    before = unclear[p]
                    unclear[p] = before + delta
                    if before < 2 or before + delta < 2:
                        stack.append(p)

    # -- readiness ----------------------------------------------------------

    def readiness(self, name: str) -> str | None:
        """EXECUTE or REVERT if the atom may start that now, else None."""
        return self.readiness_at(self._index[name], name)

    def readiness_at(self, number: int, name: str) -> str | None:
        """:meth:`readiness` of ``name``, numbered ``number`` (see take_candidate_numbers)."""
        if name in self.in_flight:
            return None
        own = self._flags[number]
        if own & _INTENT_EXECUTE:
            if self._pending[number] >= 2:
                return None
            # PENDING -> RUNNING is always allowed (the usual case: no lookup).
            if own & _STATE_PENDING or self._can(name, self._state[number], st.RUNNING):
                return EXECUTE
        elif own & _INTENT_REVERT:
            if self._unclear[number] < 2 and self._can(name, self._state[number], st.REVERTING):
                return REVERT
        return None

    def take_candidate_numbers(self) -> list[int]:
        """Pop the atoms to re-examine as their positions in ``order``, in that order.

        The runtime reads each one's name from its own copy of the order and
        asks :meth:`readiness_at`: no lookup by name in between.
        """
        if self._all_candidates:
            self._all_candidates = False
            self._candidates = set()
            return self._atom_ids
        found = self._candidates
        if not found:
            return []
        self._candidates = set()
        return sorted(found)

    def take_candidates(self) -> list[str]:
        """Pop the atoms to re-examine, in graph order (the ``order`` given)."""
        order = self._order
        return [order[i] for i in self.take_candidate_numbers()]

    def is_success(self) -> bool:
        """Whether every atom succeeded or was ignored."""
        state = self._state
        return all(
            state[i] == st.SUCCESS or state[i] == st.IGNORE or state[i] is _UNKNOWN
            for i in self._atom_ids
        )

    def any_ready(self) -> bool:
        """Whether some atom could start now (:meth:`readiness` of each, by position)."""
        order = self._order
        return any(self.readiness_at(i, order[i]) is not None for i in self._atom_ids)
