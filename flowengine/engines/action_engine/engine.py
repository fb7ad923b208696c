"""Action engines: compile a flow, then run it with a state machine and executors."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from automaton import runners

from flowengine import exceptions as exc
from flowengine import states, tracing
from flowengine import storage as fe_storage
from flowengine.engines import base
from flowengine.engines.action_engine import builder, compiler
from flowengine.engines.action_engine import executor as ex
from flowengine.engines.action_engine import runtime as rt
from flowengine.types import failure as ft
from flowengine.utils import gc_freeze

LOG = logging.getLogger(__name__)


_P = ParamSpec("_P")
_R = TypeVar("_R")
_EngineMethod = Callable[Concatenate["ActionEngine", _P], _R]


def _pre_check(
    compiled: bool = True,
    storage_ensured: bool = True,
    validated: bool = True,
) -> Callable[[_EngineMethod[_P, _R]], _EngineMethod[_P, _R]]:
    """Refuse to run a method before the engine reached the needed stage."""

    def decorator(meth: _EngineMethod[_P, _R]) -> _EngineMethod[_P, _R]:
        what = meth.__name__

        @functools.wraps(meth)
        def wrapper(self: ActionEngine, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            if compiled and not self._compiled:
                raise exc.InvalidState(f"Can not {what} an engine which has not been compiled")
            if storage_ensured and not self._storage_ensured:
                raise exc.InvalidState(
                    f"Can not {what} an engine which has not had its storage populated"
                )
            if validated and not self._validated:
                raise exc.InvalidState(f"Can not {what} an engine which has not been validated")
            return meth(self, *args, **kwargs)

        return wrapper

    return decorator


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return bool(value)


@contextlib.contextmanager
def _started(task_executor: Any, retry_executor: Any) -> Iterator[None]:
    task_executor.start()
    try:
        retry_executor.start()
        try:
            yield
        finally:
            retry_executor.stop()
    finally:
        task_executor.stop()


class ActionEngine(base.Engine):
    """Compiles a flow to a graph of atoms and runs it (options as TaskFlow's).

    Options: ``defer_reverts`` (a retry's REVERT defers to the enclosing
    retry), ``never_resolve`` (a failure stops the engine without reverting),
    ``inject_transient`` (atom-scoped ``inject`` values kept in memory only,
    default True), ``gather_statistics`` (default True).

    With OpenTelemetry installed, runs are traced (:mod:`flowengine.tracing`).
    """

    #: Final states that do not re-raise the failures seen during the run.
    NO_RERAISING_STATES = frozenset([states.SUSPENDED, states.SUCCESS])

    #: Informational machine states run_iter() yields but the flow never takes.
    IGNORABLE_STATES = frozenset(
        itertools.chain(
            [states.SCHEDULING, states.WAITING, states.RESUMING, states.ANALYZING],
            builder.META_STATES,
        )
    )

    #: Machine transitions kept for the log when a run blows up.
    MAX_MACHINE_STATES_RETAINED = 10

    def __init__(self, flow: Any, flow_detail: Any, backend: Any, options: Any) -> None:
        super().__init__(flow, flow_detail, backend, options)
        self._runtime: rt.Runtime | None = None
        self._compiled = False
        self._compilation: compiler.Compilation | None = None
        self._lock = threading.RLock()
        self._state_lock = threading.RLock()
        self._storage_ensured = False
        self._validated = False
        self._storage: fe_storage.Storage | None = None
        self._flow_state: str | None = None
        # Retries always run in the engine's own thread.
        self._retry_executor = ex.SerialRetryExecutor()
        self._inject_transient = _as_bool(self._options.get("inject_transient", True))
        self._gather_statistics = _as_bool(self._options.get("gather_statistics", True))
        self._statistics: dict[str, Any] = {}
        # Made here so a bad executor option fails at load time, not at run.
        self._task_executor = self._task_executor_factory()
        if tracing.enabled():
            from flowengine.tracing import engine_spans

            engine_spans.watch(self)

    def _task_executor_factory(self) -> ex.TaskExecutor:
        """Make the executor this engine runs tasks with (subclasses override)."""
        return ex.SerialTaskExecutor()

    @property
    def statistics(self) -> dict[str, Any]:
        return self._statistics

    @property
    def task_notifier(self) -> Any:
        """TaskFlow's older name for :attr:`atom_notifier`."""
        return self.atom_notifier

    @property
    def compilation(self) -> compiler.Compilation | None:
        """The compiled flow (None until compile() succeeded)."""
        return self._compilation if self._compiled else None

    def draw(self, path: str | None = None, states: bool = True) -> str:
        """The flow's graph as DOT text, also written to ``path`` (.dot/.svg/.png) if given.

        With ``states`` atoms are coloured by their state in storage (after
        a run). Rendering SVG/PNG needs Graphviz's ``dot`` (GraphvizMissing).
        """
        from flowengine.engines.action_engine import graph_draw

        return graph_draw.draw_engine(self, path, states)

    @property
    def storage(self) -> fe_storage.Storage:
        if self._storage is None:
            with self._lock:
                if self._storage is None:
                    self._storage = fe_storage.Storage(
                        self._flow_detail, backend=self._backend, scope_fetcher=self._fetch_scopes
                    )
                    # A result missing a declared index/key: a warning (as in
                    # TaskFlow) unless the user asked for a failure.
                    self._storage.strict_results = bool(self._options.get("strict_results", False))
        return self._storage

    def _fetch_scopes(self, atom_name: str) -> Any:
        if self._compiled and self._runtime is not None:
            return self._runtime.fetch_scopes_for(atom_name)
        return None

    @_pre_check(compiled=True, storage_ensured=False, validated=False)
    def suspend(self) -> None:
        """Stop starting new atoms; the run ends SUSPENDED once running ones finish."""
        self._change_state(states.SUSPENDING)

    def run(self, timeout: float | None = None) -> None:
        """Run the flow to completion (or until suspended), re-raising its failure.

        ``timeout`` bounds each wait for running atoms (the engine then waits
        again); it never abandons them.
        """
        if not self._lock.acquire(blocking=False):
            raise exc.ExecutionFailure("Engine currently locked, please try again later")
        try:
            for _state in self.run_iter(timeout=timeout):
                pass
        finally:
            self._lock.release()

    def run_iter(self, timeout: float | None = None) -> Generator[str, object, None]:
        """Run, yielding each engine state (send a truthy value to suspend)."""
        self.compile()
        self.prepare()
        self.validate()
        # The flow, compilation and storage outlive the run: collections
        # during it need not walk them (see utils.gc_freeze).
        with gc_freeze.frozen_heap():
            yield from self._run(timeout)

    def _run(self, timeout: float | None) -> Generator[str, object, None]:
        last_transitions: collections.deque[tuple[str | None, str | None]] = collections.deque(
            maxlen=max(1, self.MAX_MACHINE_STATES_RETAINED)
        )
        with _started(self._task_executor, self._retry_executor):
            self._change_state(states.RUNNING)
            started = time.monotonic()
            if self._gather_statistics:
                self._statistics.clear()
            try:
                closed = False
                machine, memory = builder.MachineBuilder(
                    self._compiled_runtime, self._is_runnable
                ).build(
                    self._statistics, timeout=timeout, gather_statistics=self._gather_statistics
                )
                runner = runners.FiniteRunner(machine)
                for transition in runner.run_iter(builder.START):
                    last_transitions.append(transition)
                    new_state = transition[1]
                    # automaton types both ends Optional; only the source of
                    # the first transition is None, never a target.
                    assert new_state is not None
                    if new_state in builder.META_STATES:
                        continue
                    if new_state == states.FAILURE:
                        ft.Failure.reraise_if_any(memory.failures)
                    if closed:
                        continue
                    try:
                        try_suspend = yield new_state
                    except GeneratorExit:
                        # Closed early: suspend and let running atoms finish.
                        closed = True
                        self.suspend()
                    except Exception:
                        memory.failures.append(ft.Failure())
                        closed = True
                    else:
                        if try_suspend:
                            self.suspend()
            except Exception:
                LOG.exception(
                    "Engine execution has failed, something bad must have"
                    " happened (last %s machine transitions were %s)",
                    last_transitions.maxlen,
                    list(last_transitions),
                )
                self._change_state(states.FAILURE)
                raise
            else:
                if last_transitions:
                    new_state = last_transitions[-1][1]
                    if new_state is not None and new_state not in self.IGNORABLE_STATES:
                        self._change_state(new_state)
                        if new_state not in self.NO_RERAISING_STATES:
                            failures = itertools.chain(
                                self.storage.get_execute_failures().values(),
                                self.storage.get_revert_failures().values(),
                            )
                            ft.Failure.reraise_if_any(list(failures))
            finally:
                if self._gather_statistics:
                    self._statistics["active_for"] = time.monotonic() - started

    def _is_runnable(self) -> bool:
        return self._flow_state == states.RUNNING

    def _change_state(self, state: str) -> None:
        with self._state_lock:
            try:
                moved, old_state = self.storage.change_flow_state(state)
            finally:
                # Act on the new state even when saving it failed (a write
                # refused by a fence): a suspend must still stop scheduling.
                self._flow_state = self.storage.get_flow_state()
            if not moved:
                return
        self.notifier.notify(
            state,
            {
                "engine": self,
                "flow_name": self.storage.flow_name,
                "flow_uuid": self.storage.flow_uuid,
                "old_state": old_state,
            },
        )

    @property
    def _compiled_runtime(self) -> rt.Runtime:
        """The runtime, for methods that ``_pre_check(compiled=True)`` lets through."""
        if self._runtime is None:
            raise exc.InvalidState("The engine has not been compiled")
        return self._runtime

    def _ensure_storage(self) -> None:
        runtime = self._compiled_runtime
        atoms = [runtime.atoms[name] for name in runtime.atom_order]
        self.storage.ensure_atoms(atoms)
        for atom in atoms:
            if atom.inject:
                self.storage.inject_atom_args(
                    atom.name, atom.inject, transient=self._inject_transient
                )

    @_pre_check(compiled=True, storage_ensured=True, validated=False)
    def validate(self) -> None:
        """Raise MissingDependencies naming each atom whose arguments nobody provides."""
        with self._lock:
            for ambiguity in self._compiled_runtime.ambiguities():
                raise ambiguity.error()
            missing: set[str] = set()
            last_cause: BaseException | None = None
            last_atom = None
            missing_atoms = 0
            for atom, method, symbols in self._compiled_runtime.unsatisfied():
                last_cause = exc.MissingDependencies(
                    atom, sorted(symbols), cause=last_cause, method=method
                )
                last_atom = atom
                missing_atoms += 1
                missing.update(symbols)
            if missing:
                if missing_atoms == 1 and last_atom is self._flow and last_cause is not None:
                    raise last_cause
                raise exc.MissingDependencies(self._flow, sorted(missing), cause=last_cause)
            self._validated = True

    @_pre_check(compiled=True, storage_ensured=False, validated=False)
    def prepare(self) -> None:
        """Register every atom in storage (once); reset a previously reverted flow."""
        with self._lock:
            if not self._storage_ensured:
                # RESUMING -> (atoms ensured in storage) -> SUSPENDED, so
                # listeners see a resumption (both are no-ops for a new flow).
                self._change_state(states.RESUMING)
                # The atom details made here outlive the block and run no
                # user code: collections would only walk them (utils.gc_freeze).
                with gc_freeze.collector_paused():
                    self._ensure_storage()
                self._change_state(states.SUSPENDED)
                self._storage_ensured = True
            if self.storage.get_flow_state() == states.REVERTED:
                self.reset()

    @_pre_check(compiled=True, storage_ensured=True, validated=False)
    def reset(self) -> None:
        """Move every atom back to PENDING (intention EXECUTE) and the flow to PENDING."""
        with self._lock:
            self._compiled_runtime.reset_all()
            self._change_state(states.PENDING)

    def compile(self) -> None:
        """Compile the flow (once); raises on cycles, duplicate names, bad items."""
        with self._lock:
            if self._compiled:
                return
            self._compilation = compiler.PatternCompiler(self._flow).compile()
            self._runtime = rt.Runtime(
                self._compilation,
                self.storage,
                self.atom_notifier,
                self._task_executor,
                self._retry_executor,
                options=self._options,
            )
            self._runtime.compile()
            self._compiled = True
            self._flow_state = self.storage.get_flow_state()


class SerialActionEngine(ActionEngine):
    """Runs tasks one after another in the calling thread."""


class _ExecutorTextMatch(NamedTuple):
    """Executor names (any case) and how to get the executor class they select."""

    strings: frozenset[str]
    load_cls: Callable[[], type[ex.ParallelTaskExecutor]]

    def matches(self, text: str) -> bool:
        return text.lower() in self.strings


def _thread_executor_cls() -> type[ex.ParallelTaskExecutor]:
    return ex.ParallelThreadTaskExecutor


def _process_executor_cls() -> type[ex.ParallelTaskExecutor]:
    # Imported on demand: multiprocessing is not needed by thread-only users.
    from flowengine.engines.action_engine import process_executor

    return process_executor.ParallelProcessTaskExecutor


class ParallelActionEngine(ActionEngine):
    """Runs independent tasks at the same time (threads, or processes).

    Options: ``executor`` -- 'threads'/'threaded'/'thread' (default),
    'processes'/'process', or a :class:`concurrent.futures.Executor` instance
    (a ProcessPoolExecutor selects the process variant); ``max_workers``.
    """

    _executor_str_matchers = [
        _ExecutorTextMatch(frozenset(["thread", "threads", "threaded"]), _thread_executor_cls),
        _ExecutorTextMatch(frozenset(["process", "processes"]), _process_executor_cls),
    ]

    _default_executor_cls = ex.ParallelThreadTaskExecutor

    def _task_executor_factory(self) -> ex.TaskExecutor:
        return self._fetch_task_executor(self._options)

    @classmethod
    def _fetch_task_executor(cls, options: Mapping[str, Any]) -> ex.TaskExecutor:
        kwargs: dict[str, Any] = {}
        executor_cls: type[ex.ParallelTaskExecutor] = cls._default_executor_cls
        desired = options.get("executor")
        if isinstance(desired, str):
            for m in cls._executor_str_matchers:
                if m.matches(desired):
                    executor_cls = m.load_cls()
                    break
            else:
                expected = sorted(
                    itertools.chain.from_iterable(m.strings for m in cls._executor_str_matchers)
                )
                raise ValueError(
                    f"Unknown executor string '{desired}' expected one of"
                    f" {expected} (or mixed case equivalent)"
                )
        elif isinstance(desired, ex.TaskExecutor):
            return desired
        elif desired is not None:
            if isinstance(desired, cf.ProcessPoolExecutor):
                executor_cls = _process_executor_cls()
            elif isinstance(desired, cf.Executor):
                executor_cls = ex.ParallelThreadTaskExecutor
            else:
                expected_types = [cf.ThreadPoolExecutor, cf.ProcessPoolExecutor, cf.Executor]
                raise TypeError(
                    f"Unknown executor '{desired}' ({type(desired)}) expected"
                    f" an instance of {expected_types}"
                )
            kwargs["executor"] = desired
        for key, convert in executor_cls.constructor_options:
            if key in options:
                kwargs[key] = convert(options[key])
        return executor_cls(**kwargs)
