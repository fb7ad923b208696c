"""The runtime: a compiled flow's atoms, their states, actions and helpers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from flowengine import states as st
from flowengine.engines.action_engine import analyzer as an
from flowengine.engines.action_engine import completer as co
from flowengine.engines.action_engine import deciders as de
from flowengine.engines.action_engine import executor as ex
from flowengine.engines.action_engine import scheduler as sc
from flowengine.engines.action_engine.actions import retry as ra
from flowengine.engines.action_engine.actions import task as ta
from flowengine.engines.action_engine.compiler import ArgSpec

if TYPE_CHECKING:
    from flowengine.engines.action_engine.compiler import Compilation
    from flowengine.storage import Storage
    from flowengine.types.notifier import Notifier


class Runtime:
    """Everything the engine's state machine needs while running one flow."""

    def __init__(
        self,
        compilation: Compilation,
        storage: Storage,
        atom_notifier: Notifier,
        task_executor: ex.TaskExecutor,
        retry_executor: ex.SerialRetryExecutor,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.compilation = compilation
        self.storage = storage
        self.options = dict(options or {})
        self._atom_notifier = atom_notifier
        self._task_executor = task_executor
        self._retry_executor = retry_executor

    # -- compile ------------------------------------------------------------

    def compile(self) -> None:
        """Precompute per-atom lookups (graph neighbours, deciders, actions)."""
        topology = self.compilation.topology
        self.topology = topology
        kinds = topology.kinds
        # The topology's node numbers in topological order; the analyzer
        # numbers nodes by position in it and takes its neighbours as
        # numbers (no name looked up per edge, issue 38).
        numbers = topology.topological_numbers()
        names = topology.order
        order = [names[i] for i in numbers]
        # Name -> position, the one table by name the run reads per task
        # (the analyzer's state, intention and counters are lists by
        # position): filled in the order atoms start in, so that the run
        # reads its entries nearly in sequence (issue 38).
        self.order_index = {n: i for i, n in enumerate(order)}
        first_atom = topology.first_atom
        atom_ids = [k for k, i in enumerate(numbers) if i >= first_atom]
        #: Atom name -> atom (the compilation's own table, not a copy).
        self.atoms: Mapping[str, Any] = self.compilation.atoms
        #: Atom names in the analyzer's graph order (the order atoms start in).
        self.atom_order = [order[k] for k in atom_ids]
        self.retries = [n for n in self.atom_order if kinds[n] == de.RETRY]
        retries = set(self.retries)
        self._is_retry = retries.__contains__
        #: The analyzer's node order: its candidates are positions in it.
        self.analyzer_order = order
        self.analyzer = an.Analyzer(
            order,
            topology.successors_renumbered(numbers),
            atom_ids,
            self._can_transition,
            self.order_index,
        )
        # Only atoms behind a link with a decider have any (most flows have none).
        self.edge_deciders: dict[str, tuple[de.EdgeDecider, ...]] = {}
        if topology.deciders:
            memo: dict[str, tuple[de.EdgeDecider, ...]] = {}
            for n in self.atom_order:
                found = de.edge_deciders_for(topology, n, memo)
                if found:
                    self.edge_deciders[n] = found
        self._subgraphs: dict[str, list[str]] = {}
        self._scopes: dict[str, list[list[str]]] = {}
        self._retry_of: dict[str, str | None] = {}
        tracker = self.analyzer.update
        state_of = self.analyzer.state_of
        self.task_action = ta.TaskAction(
            self.storage,
            self._atom_notifier,
            tracker,
            self.uuid_of,
            state_of,
            self.fetch_args,
            self._task_executor,
        )
        self.retry_action = ra.RetryAction(
            self.storage,
            self._atom_notifier,
            tracker,
            self.uuid_of,
            state_of,
            self.fetch_args,
            self._retry_executor,
        )
        self.completer = co.Completer(self)
        self.scheduler = sc.Scheduler(self)

    @property
    def graph(self) -> Any:
        """The compilation's networkx execution graph (built on first use)."""
        return self.compilation.execution_graph

    def _plan(self, name: str, revert: bool) -> tuple[tuple[str, str, tuple[str, ...], bool], ...]:
        # Resolved by the compiler: which atoms provide each argument,
        # closest first (rows are (arg_name, symbol, providers, optional)).
        return self.compilation.plan_rows(name, revert)

    def fetch_args(self, name: str, revert: bool = False) -> dict[str, Any]:
        """The arguments for an atom's execute (or revert), from storage."""
        return self.storage.fetch_args(name, self._plan(name, revert))

    def unsatisfied(self) -> Iterator[tuple[Any, str, set[str]]]:
        """Yield ``(atom, 'execute'|'revert', missing symbols)`` for unmet requirements."""
        # Only atoms with a symbol no atom in scope provides can miss one.
        for name in self.compilation.needing_outside_values():
            atom = self.atoms[name]
            for method, plan in (
                ("execute", self._plan(name, False)),
                ("revert", self._plan(name, True)),
            ):
                missing_args = self.storage.unsatisfied_args(name, plan)
                if missing_args:
                    symbols = {spec[1] for spec in plan if spec[0] in missing_args}
                    yield atom, method, symbols

    def ambiguities(self) -> Iterator[Any]:
        """Ambiguous lookups (two unordered providers) not settled by injected values."""
        for ambiguity in getattr(self.compilation, "ambiguities", tuple)():
            probe = (ArgSpec(ambiguity.symbol, ambiguity.symbol, (), False),)
            if self.storage.unsatisfied_args(ambiguity.atom, probe):
                yield ambiguity

    _TRANSITIONS: dict[tuple[bool, str, str], bool] = {}

    def _can_transition(self, name: str, old: str, new: str) -> bool:
        key = (self._is_retry(name), old, new)
        allowed = self._TRANSITIONS.get(key)
        if allowed is None:
            check = st.check_retry_transition if key[0] else st.check_task_transition
            try:
                allowed = bool(check(old, new))
            except Exception:
                allowed = False
            self._TRANSITIONS[key] = allowed
        return allowed

    # -- lookups ------------------------------------------------------------

    def uuid_of(self, name: str) -> str:
        """The atom's uuid in storage."""
        # Read from the atom's detail each time, which its state change has
        # just touched: a cache by name was one more table of n entries
        # spread over the heap (issue 38).
        return self.storage.get_atom_uuid(name)

    def action_for(self, name: str) -> Any:
        """The action (task or retry) that moves this atom."""
        return self.retry_action if self._is_retry(name) else self.task_action

    def retry_of(self, name: str) -> str | None:
        """The retry controller whose subflow holds ``name`` (not itself)."""
        try:
            return self._retry_of[name]
        except KeyError:
            pass
        found = self.compilation.retry_of(name)
        if found == name:
            found = self._parent_retry(name)
        self._retry_of[name] = found
        return found

    def _parent_retry(self, retry: str) -> str | None:
        # The nearest retry controlling this retry: the closest other retry
        # whose subflow contains it.
        best = None
        for other in self.retries:
            if other != retry and retry in self.subgraph_set(other):
                if best is None or self.order_index[other] > self.order_index[best]:
                    best = other
        return best

    def subgraph(self, name: str) -> list[str]:
        """Atoms after ``name`` in the graph (a retry's subflow and beyond)."""
        found = self._subgraphs.get(name)
        if found is None:
            found = sorted(
                self.topology.descendants(name) & self.atoms.keys(),
                key=self.order_index.__getitem__,
            )
            self._subgraphs[name] = found
        return found

    def subgraph_set(self, name: str) -> set[str]:
        """Set of :meth:`subgraph`."""
        return set(self.subgraph(name))

    def fetch_scopes_for(self, atom_name: str) -> list[list[str]] | None:
        """Atoms ``atom_name`` can see, closest first, one per level (storage lookups).

        Only used when someone asks storage for an atom's arguments by name
        (the engine itself uses the compiler's per-argument plans); None for
        an unknown name.
        """
        if atom_name not in self.atoms:
            return None
        levels = self._scopes.get(atom_name)
        if levels is None:
            visible = self.topology.ancestors(atom_name) & self.atoms.keys()
            ordered = sorted(visible, key=self.order_index.__getitem__, reverse=True)
            levels = self._scopes[atom_name] = [[name] for name in ordered]
        return levels

    # -- state changes ------------------------------------------------------

    def load_states(self) -> None:
        """Read every atom's state and intention from storage."""
        storage = self.storage
        self.analyzer.load(
            (name, storage.get_atom_state(name), storage.get_atom_intention(name))
            for name in self.atom_order
        )

    def set_intentions(self, names: Iterable[str], intention: str) -> None:
        """Give each atom ``intention`` (persisted)."""
        current = self.analyzer.intention_of
        for name in names:
            if current(name) != intention:
                self.storage.set_atom_intention(name, intention)
                self.analyzer.update(name, intention=intention)

    def reset_atoms(
        self,
        names: Iterable[str],
        state: str | None = st.PENDING,
        intention: str | None = st.EXECUTE,
    ) -> None:
        """Move atoms to ``state`` (notifying) and give them ``intention``."""
        for name in names:
            if state is not None:
                atom = self.atoms[name]
                if self._is_retry(name):
                    self.retry_action.change_state(atom, state)
                else:
                    self.task_action.reset(atom, state)
            if intention is not None:
                self.set_intentions((name,), intention)

    def reset_all(self, state: str = st.PENDING, intention: str = st.EXECUTE) -> None:
        """Reset every atom (used before re-running a reverted flow)."""
        self.load_states()
        self.reset_atoms(self.atom_order, state=state, intention=intention)

    def retry_subflow(self, retry: str) -> None:
        """Make a retry's subflow PENDING/EXECUTE again and the retry EXECUTE."""
        self.set_intentions((retry,), st.EXECUTE)
        self.reset_atoms(self.subgraph(retry))

    # -- running ------------------------------------------------------------

    def resume(self) -> list[tuple[str, str]]:
        """Load states, finish interrupted decisions; return atoms to restart."""
        self.load_states()
        state_of, intention_of = self.analyzer.state_of, self.analyzer.intention_of
        if self.completer.resolving:
            for name in self.atom_order:
                if state_of(name) == st.FAILURE and intention_of(name) == st.EXECUTE:
                    self.completer.process_failure(name, self.storage.get(name))
        for retry in self.retries:
            if state_of(retry) == st.RETRYING:
                self.retry_subflow(retry)
        restart = []
        for name in self.atom_order:
            state = state_of(name)
            if state == st.RUNNING and intention_of(name) == st.EXECUTE:
                restart.append((name, an.EXECUTE))
            elif state == st.REVERTING:
                restart.append((name, an.REVERT))
        return restart

    def next_ready(self) -> list[tuple[str, str]]:
        """Atoms that may start now (deciders consulted; vetoed ones ignored)."""
        analyzer = self.analyzer
        ready: list[tuple[str, str]] = []
        order = self.analyzer_order
        readiness_at = analyzer.readiness_at
        while True:
            numbers = analyzer.take_candidate_numbers()
            if not numbers:
                if len(ready) > 1:
                    # Higher priority first (TaskFlow's atom.priority), then
                    # graph order; stable so equal priorities keep it.
                    ready.sort(key=self._priority_key)
                return ready
            for number in numbers:
                name = order[number]
                what = readiness_at(number, name)
                if what is None:
                    continue
                if what == an.EXECUTE and name in self.edge_deciders and not self._decide(name):
                    continue
                ready.append((name, what))

    def _priority_key(self, item: tuple[str, str]) -> tuple[int, int]:
        name = item[0]
        return -getattr(self.atoms[name], "priority", 0), self.order_index[name]

    def any_ready(self) -> bool:
        """Whether some atom could still start (used to tell SUSPENDED apart)."""
        return self.analyzer.any_ready()

    def _decide(self, name: str) -> bool:
        analyzer = self.analyzer
        history: dict[str, Any] = {}
        voters = []
        for ed in self.edge_deciders[name]:
            if ed.kind in de.ATOM_KINDS:
                if analyzer.state_of(ed.from_node) == st.IGNORE:
                    continue  # an ignored atom has no say
                history[ed.from_node] = self.storage.get(ed.from_node)
            else:
                for atom_name in self._flow_atoms(ed.from_node):
                    if analyzer.state_of(atom_name) != st.IGNORE:
                        history[atom_name] = self.storage.get(atom_name)
            voters.append(ed)
        # Each link's decider is asked, once per link, as TaskFlow does (the
        # same callable on two links is called twice: it may count calls).
        nays = [ed for ed in voters if not ed.decider(history=history)]
        if not nays:
            return True
        depth = de.pick_depth(nays)
        self.reset_atoms(
            de.affected_atoms(self.topology, name, depth), state=st.IGNORE, intention=st.IGNORE
        )
        return False

    def _flow_atoms(self, flow_node: str) -> list[str]:
        getter = getattr(self.compilation, "flow_atoms", None)
        if getter is not None:
            # A decider on a link out of a flow sits on the flow's end node;
            # the compiler indexes flows by their start node.
            start = flow_node
            if self.topology.kinds.get(flow_node) == de.FLOW_END:
                start = self.compilation.flow_start_of(flow_node)
            try:
                return [n for n in getter(start) if n in self.atoms]
            except (KeyError, ValueError):
                pass
        return [n for n in self.topology.ancestors(flow_node) if n in self.atoms]
