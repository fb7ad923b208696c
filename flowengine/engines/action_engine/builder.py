"""The engine's state machine (declared with automaton, frozen once built).

==============  =================  ============
 from state      event              to state
==============  =================  ============
 UNDEFINED       start              RESUMING
 RESUMING        schedule_next      SCHEDULING
 SCHEDULING      wait_finished      WAITING
 WAITING         examine_finished   ANALYZING
 ANALYZING       schedule_next      SCHEDULING
 ANALYZING       wait_finished      WAITING
 ANALYZING       completed          GAME_OVER
 GAME_OVER       success            SUCCESS
 GAME_OVER       reverted           REVERTED
 GAME_OVER       suspended          SUSPENDED
 GAME_OVER       failed             FAILURE
==============  =================  ============

SUCCESS, REVERTED, SUSPENDED and FAILURE are terminal. Between two states, if
the engine was asked to suspend or an unresolvable failure happened, no new
atom is started; atoms already running are waited for.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from automaton import machines

from flowengine import states as st
from flowengine.engines.action_engine import executor as ex
from flowengine.types import failure as ft

if TYPE_CHECKING:
    from flowengine.engines.action_engine.runtime import Runtime

LOG = logging.getLogger(__name__)

#: An automaton reaction: ``(old_state, new_state, event) -> next event``.
Reaction = Callable[[str, str, str], str]

# Meta states: the machine passes through them but run_iter() never yields them.
UNDEFINED = st.UNDEFINED
GAME_OVER = st.GAME_OVER
META_STATES = (GAME_OVER, UNDEFINED)

# Events.
START = "start"
SCHEDULE = "schedule_next"
WAIT = "wait_finished"
ANALYZE = "examine_finished"
FINISH = "completed"
FAILED = "failed"
SUSPENDED = "suspended"
SUCCESS = "success"
REVERTED = "reverted"


def _declare(m: machines.FiniteMachine) -> machines.FiniteMachine:
    """Add the engine's states and transitions (the table above) to ``m``."""
    for state in (GAME_OVER, UNDEFINED, st.ANALYZING, st.RESUMING, st.SCHEDULING, st.WAITING):
        m.add_state(state)
    for state in (st.REVERTED, st.SUCCESS, st.SUSPENDED, st.FAILURE):
        m.add_state(state, terminal=True)
    m.default_start_state = UNDEFINED
    m.add_transition(UNDEFINED, st.RESUMING, START)
    m.add_transition(st.RESUMING, st.SCHEDULING, SCHEDULE)
    m.add_transition(st.SCHEDULING, st.WAITING, WAIT)
    m.add_transition(st.WAITING, st.ANALYZING, ANALYZE)
    m.add_transition(st.ANALYZING, st.SCHEDULING, SCHEDULE)
    m.add_transition(st.ANALYZING, st.WAITING, WAIT)
    m.add_transition(st.ANALYZING, GAME_OVER, FINISH)
    m.add_transition(GAME_OVER, st.SUCCESS, SUCCESS)
    m.add_transition(GAME_OVER, st.REVERTED, REVERTED)
    m.add_transition(GAME_OVER, st.SUSPENDED, SUSPENDED)
    m.add_transition(GAME_OVER, st.FAILURE, FAILED)
    return m


def transition_table() -> str:
    """The engine machine's transition table as text (for the docs)."""
    m = _declare(machines.FiniteMachine())
    m.freeze()
    return m.pformat()


#: States whose time engine.statistics['seconds_per_state'] reports (TaskFlow's).
TIMED_STATES = (st.ANALYZING, st.RESUMING, st.SCHEDULING, st.WAITING)


class MachineMemory:
    """What the machine carries between states during one run."""

    def __init__(self) -> None:
        self.next_up: list[tuple[str, str]] = []
        self.not_done: dict[ex.OutcomeFuture, str] = {}
        self.done: list[ex.OutcomeFuture] = []
        # Futures put themselves here when they finish (see _wait).
        self.completed: queue.SimpleQueue[ex.OutcomeFuture] = queue.SimpleQueue()
        self.failures: list[ft.Failure] = []


def _wait(
    completed: queue.SimpleQueue[ex.OutcomeFuture], timeout: float | None
) -> list[ex.OutcomeFuture]:
    """Block until at least one future finished (no polling); take all finished."""
    # Futures report themselves to `completed` when done (add_done_callback),
    # so each wait costs O(finished), not O(running) as concurrent.futures.wait
    # would (it registers a waiter on every pending future on every call).
    try:
        done = [completed.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            done.append(completed.get_nowait())
        except queue.Empty:
            return done


class MachineBuilder:
    """Builds the state machine that drives one engine run."""

    def __init__(self, runtime: Runtime, is_runnable: Callable[[], bool]) -> None:
        self._runtime = runtime
        self._is_runnable = is_runnable

    def build(
        self,
        statistics: dict[str, Any],
        timeout: float | None = None,
        gather_statistics: bool = True,
    ) -> tuple[machines.FiniteMachine, MachineMemory]:
        """Return a fresh frozen machine and the memory its reactions share."""
        memory = MachineMemory()
        runtime = self._runtime
        completer = runtime.completer
        scheduler = runtime.scheduler
        is_runnable = self._is_runnable
        seconds_per_state = {state.lower(): 0.0 for state in TIMED_STATES}
        if gather_statistics:
            statistics.update(
                discarded_failures=0,
                awaiting=0,
                completed=0,
                incomplete=0,
                seconds_per_state=seconds_per_state,
            )

        def timed(state: str, reaction: Reaction) -> Reaction:
            """``reaction``, adding its time to seconds_per_state (TaskFlow's statistic)."""
            if not gather_statistics:
                return reaction
            key = state.lower()

            def run(old_state: str, new_state: str, event: str) -> str:
                started = time.monotonic()
                try:
                    return reaction(old_state, new_state, event)
                finally:
                    seconds_per_state[key] += time.monotonic() - started

            return run

        def resume(old_state: str, new_state: str, event: str) -> str:
            restart = runtime.resume()
            seen = {name for name, _ in restart}
            memory.next_up.extend(restart)
            memory.next_up.extend(r for r in runtime.next_ready() if r[0] not in seen)
            return SCHEDULE

        def game_over(old_state: str, new_state: str, event: str) -> str:
            if memory.failures:
                return FAILED
            if memory.next_up or runtime.any_ready():
                return SUSPENDED
            if runtime.analyzer.is_success():
                return SUCCESS
            return REVERTED

        def schedule(old_state: str, new_state: str, event: str) -> str:
            if memory.next_up and is_runnable():
                futures, failures = scheduler.schedule(memory.next_up)
                memory.not_done.update(futures)
                report = memory.completed.put
                for fut in futures:
                    fut.add_done_callback(report)
                memory.failures.extend(failures)
                memory.next_up = []
            return WAIT

        def wait(old_state: str, new_state: str, event: str) -> str:
            if memory.not_done:
                done = _wait(memory.completed, timeout)
                memory.done.extend(done)
                if gather_statistics:
                    statistics["awaiting"] = len(memory.not_done) - len(done)
            return ANALYZE

        def analyze(old_state: str, new_state: str, event: str) -> str:
            not_done = memory.not_done
            for fut in memory.done:
                name = not_done.pop(fut)
                try:
                    try:
                        outcome, result = fut.result()
                    except Exception:
                        # Executors should resolve to a Failure, not raise; if
                        # one raises anyway it is still this atom's failure.
                        outcome = (
                            ex.EXECUTED
                            if runtime.analyzer.state_of(name) == st.RUNNING
                            else ex.REVERTED
                        )
                        result = ft.Failure()
                    result = completer.complete(name, outcome, result)
                    if isinstance(result, ft.Failure):
                        if completer.complete_failure(name, outcome, result):
                            memory.failures.append(result)
                        elif gather_statistics:
                            statistics["discarded_failures"] += 1
                except Exception:
                    memory.failures.append(ft.Failure())
                if gather_statistics:
                    statistics["completed"] += 1
            memory.done = []
            try:
                more = runtime.next_ready()
            except Exception:
                memory.failures.append(ft.Failure())
                more = []
            if more:
                memory.next_up.extend(more)
            if memory.next_up and is_runnable() and not memory.failures:
                return SCHEDULE
            if not_done:
                return WAIT
            if gather_statistics:
                statistics["incomplete"] = len(memory.next_up)
            return FINISH

        m = _declare(machines.FiniteMachine())
        m.add_reaction(st.RESUMING, START, timed(st.RESUMING, resume))
        m.add_reaction(st.SCHEDULING, SCHEDULE, timed(st.SCHEDULING, schedule))
        m.add_reaction(st.WAITING, WAIT, timed(st.WAITING, wait))
        m.add_reaction(st.ANALYZING, ANALYZE, timed(st.ANALYZING, analyze))
        m.add_reaction(GAME_OVER, FINISH, game_over)
        m.freeze()
        return m, memory
