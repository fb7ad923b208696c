"""Completing atoms, and resolving failures (retry, revert a subflow, revert all)."""

from __future__ import annotations

import logging
from typing import Any

from flowengine import exceptions as exc
from flowengine import states as st
from flowengine.engines.action_engine import executor as ex
from flowengine.types import failure as ft

LOG = logging.getLogger(__name__)

# Retry decisions (compared by value so enum members and plain strings match).
RETRY = "RETRY"
REVERT = "REVERT"
REVERT_ALL = "REVERT_ALL"


def _decision_value(decision: Any) -> str:
    # A Decision member, or whatever plain value a retry controller returned.
    value: str = getattr(decision, "value", decision)
    return value


class Strategy:
    """A way to resolve a failure: which atoms get which intention."""

    strategy = "?"

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def apply(self) -> None:
        """Change the intentions (and states) that resolve the failure."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(strategy={self.strategy})"


class RevertAndRetry(Strategy):
    """Revert the retry controller's subflow, then run the controller again."""

    strategy = RETRY

    def __init__(self, runtime: Any, retry: str) -> None:
        super().__init__(runtime)
        self._retry = retry

    def apply(self) -> None:
        self._runtime.set_intentions([self._retry], st.RETRY)
        self._runtime.set_intentions(self._runtime.subgraph(self._retry), st.REVERT)


class Revert(Strategy):
    """Revert the retry controller and its subflow (nothing outside it)."""

    strategy = REVERT

    def __init__(self, runtime: Any, retry: str) -> None:
        super().__init__(runtime)
        self._retry = retry

    def apply(self) -> None:
        self._runtime.set_intentions([self._retry], st.REVERT)
        self._runtime.set_intentions(self._runtime.subgraph(self._retry), st.REVERT)


class RevertAll(Strategy):
    """Revert every atom of the flow."""

    strategy = REVERT_ALL

    def apply(self) -> None:
        self._runtime.set_intentions(self._runtime.atom_order, st.REVERT)


class Completer:
    """Saves outcomes and decides how each execute failure is resolved."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        options = runtime.options
        self._defer_reverts = _as_bool(options.get("defer_reverts", False))
        self.resolving = not _as_bool(options.get("never_resolve", False))
        self._undefined = RevertAll(runtime)

    def complete(self, name: str, outcome: str, result: Any) -> Any:
        """Save an atom's outcome; return the result as saved (maybe a Failure)."""
        runtime = self._runtime
        action = runtime.action_for(name)
        atom = runtime.atoms[name]
        runtime.analyzer.in_flight.discard(name)
        if outcome == ex.EXECUTED:
            try:
                action.complete_execution(atom, result)
            except (exc.ResultMismatch, exc.SerializationFailure):
                # The task returned something its `provides` cannot be taken
                # from, or the backend cannot store (not JSON): that is the
                # task's failure, resolved like any other.
                result = ft.Failure()
                action.complete_execution(atom, result)
        else:
            try:
                action.complete_reversion(atom, result)
            except exc.SerializationFailure:
                result = ft.Failure()
                action.complete_reversion(atom, result)
        return result

    def complete_failure(self, name: str, outcome: str, failure: ft.Failure) -> bool:
        """Resolve an execute failure; return True if it must stop the engine."""
        if outcome == ex.EXECUTED and self.resolving:
            self.process_failure(name, failure)
            return False
        return True

    def process_failure(self, name: str, failure: ft.Failure) -> None:
        """Ask the enclosing retry controllers what to do and apply it."""
        resolver = self._determine(name, failure)
        LOG.debug("Resolving failure '%s' of atom '%s' with %r", failure, name, resolver)
        resolver.apply()

    def _determine(self, name: str, failure: ft.Failure) -> Strategy:
        runtime = self._runtime
        retry = runtime.retry_of(name)
        if retry is None:
            return self._undefined
        decision = _decision_value(
            runtime.retry_action.on_failure(runtime.atoms[retry], name, failure)
        )
        if decision == RETRY:
            return RevertAndRetry(runtime, retry)
        if decision == REVERT:
            parent = self._determine(retry, failure)
            if self._defer_reverts:
                return parent
            if parent is not self._undefined and parent.strategy != REVERT:
                return parent
            return Revert(runtime, retry)
        if decision == REVERT_ALL:
            return RevertAll(runtime)
        raise ValueError(f"Unknown failure resolution '{decision}' from retry '{retry}'")


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return bool(value)
