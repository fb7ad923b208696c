"""Retry controllers: atoms that decide what to do when their subflow fails."""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator, Sequence
from typing import Any

from flowengine import atom, states
from flowengine import exceptions as exc
from flowengine.types.failure import Failure
from flowengine.utils import misc


class Decision(enum.StrEnum):
    """What a retry controller decides after a failure in its subflow."""

    #: Revert this subflow, then let the enclosing retry (if any) decide.
    REVERT = "REVERT"
    #: Revert the whole flow, whatever enclosing retries would decide.
    REVERT_ALL = "REVERT_ALL"
    #: Revert this subflow and run it again.
    RETRY = "RETRY"


REVERT = Decision.REVERT
REVERT_ALL = Decision.REVERT_ALL
RETRY = Decision.RETRY

# Atom intentions, as TaskFlow programs import them from here too.
EXECUTE = states.EXECUTE
IGNORE = states.IGNORE

#: Argument the engine passes to execute/revert/on_failure: the History.
EXECUTE_REVERT_HISTORY = "history"
#: Revert keyword holding the failures that caused the revert.
REVERT_FLOW_FAILURES = atom.REVERT_FLOW_FAILURES


class History:
    """The attempts of a retry controller: (result, {atom name: Failure}) per try."""

    def __init__(
        self, contents: Sequence[tuple[Any, dict[str, Failure]]], failure: Failure | None = None
    ) -> None:
        self._contents = contents
        self._failure = failure

    @property
    def failure(self) -> Failure | None:
        """The retry controller's own failure, if it failed."""
        return self._failure

    def outcomes_iter(self, index: int | None = None) -> Iterator[tuple[str, Failure]]:
        """Yield (atom name, failure) of every attempt, or of attempt ``index`` only."""
        contents = self._contents if index is None else (self._contents[index],)
        for _provided, outcomes in contents:
            yield from outcomes.items()

    def provided_iter(self) -> Iterator[Any]:
        """Yield what the retry provided on each attempt, in order."""
        for provided, _outcomes in self._contents:
            yield provided

    def caused_by(
        self, exception_cls: Any, index: int | None = None, include_retry: bool = False
    ) -> bool:
        """Return whether a failure (of attempt index, or any) matches exception_cls."""
        for _name, failure in self.outcomes_iter(index=index):
            if failure.check(exception_cls):
                return True
        if include_retry and self._failure is not None:
            return bool(self._failure.check(exception_cls))
        return False

    def __len__(self) -> int:
        return len(self._contents)

    def __getitem__(self, index: int) -> tuple[Any, dict[str, Failure]]:
        return self._contents[index]

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Failure]]]:
        return iter(self._contents)

    def __repr__(self) -> str:
        return f"History({list(self._contents)!r}, failure={self._failure!r})"


class Retry(atom.Atom, metaclass=abc.ABCMeta):
    """Base retry controller: execute provides a value, on_failure decides.

    execute, revert and on_failure all receive ``history`` from the engine
    (it is never fetched from storage); on_failure gets the same other
    arguments as execute.
    """

    def __init__(
        self,
        name: str | None = None,
        provides: Any = None,
        requires: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        inject: Any = None,
    ) -> None:
        super().__init__(
            name=name,
            provides=provides,
            requires=requires,
            rebind=rebind,
            auto_extract=auto_extract,
            inject=inject,
            ignore_list=[EXECUTE_REVERT_HISTORY],
        )

    @abc.abstractmethod
    def execute(self, history: History, *args: Any, **kwargs: Any) -> Any:
        """Return the value the subflow's atoms use on this attempt."""

    def revert(self, history: History, *args: Any, **kwargs: Any) -> Any:
        """Undo execute when the subflow is reverted for good (no more retries)."""

    @abc.abstractmethod
    def on_failure(self, history: History, *args: Any, **kwargs: Any) -> Decision:
        """Return RETRY, REVERT or REVERT_ALL for a failure in the subflow."""


# The subclasses below keep TaskFlow's signatures, narrower or wider than
# Retry's: an atom's signature is what it requires, and the engine calls it
# with keyword arguments only, so the overrides are deliberate.


class AlwaysRevert(Retry):
    """Retry controller that always reverts its subflow."""

    def on_failure(self, *args: Any, **kwargs: Any) -> Decision:
        """Always REVERT."""
        return REVERT

    def execute(self, *args: Any, **kwargs: Any) -> None:
        """Provide nothing."""


class AlwaysRevertAll(Retry):
    """Retry controller that always reverts the whole flow."""

    def on_failure(self, **kwargs: Any) -> Decision:  # type: ignore[override]
        """Always REVERT_ALL."""
        return REVERT_ALL

    def execute(self, **kwargs: Any) -> None:  # type: ignore[override]
        """Provide nothing."""


def _give_up_decision(revert_all: bool) -> Decision:
    return REVERT_ALL if revert_all else REVERT


class Times(Retry):
    """Retry the subflow until it has run ``attempts`` times; provides the attempt number."""

    def __init__(
        self,
        attempts: int = 1,
        name: str | None = None,
        provides: Any = None,
        requires: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        revert_all: bool = False,
    ) -> None:
        super().__init__(name, provides, requires, auto_extract, rebind)
        self._attempts = attempts
        self._revert_action = _give_up_decision(revert_all)

    def on_failure(self, history: History, *args: Any, **kwargs: Any) -> Decision:
        """RETRY while fewer than ``attempts`` tries were made, then revert."""
        if len(history) < self._attempts:
            return RETRY
        return self._revert_action

    def execute(self, history: History, *args: Any, **kwargs: Any) -> int:
        """Return the number of this attempt (1 for the first run)."""
        return len(history) + 1


class ForEachBase(Retry):
    """Base of retries that try each value of a collection in turn."""

    def __init__(
        self,
        name: str | None = None,
        provides: Any = None,
        requires: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        revert_all: bool = False,
    ) -> None:
        super().__init__(name, provides, requires, auto_extract, rebind)
        self._revert_action = _give_up_decision(revert_all)

    def _get_next_value(self, values: Sequence[Any], history: History) -> Any:
        # Values already provided on earlier attempts are not tried again.
        remaining = misc.sequence_minus(values, history.provided_iter())
        if not remaining:
            raise exc.NotFound(
                f"No elements left in collection of iterable retry controller {self.name}"
            )
        return remaining[0]

    def _on_failure(self, values: Sequence[Any], history: History) -> Decision:
        try:
            self._get_next_value(values, history)
        except exc.NotFound:
            return self._revert_action
        return RETRY


class ForEach(ForEachBase):
    """Provide each of a fixed collection of values in turn, one per attempt."""

    def __init__(
        self,
        values: Sequence[Any],
        name: str | None = None,
        provides: Any = None,
        requires: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        revert_all: bool = False,
    ) -> None:
        super().__init__(name, provides, requires, auto_extract, rebind, revert_all)
        self._values = values

    def on_failure(self, history: History, *args: Any, **kwargs: Any) -> Decision:
        """RETRY while untried values remain, then revert."""
        return self._on_failure(self._values, history)

    def execute(self, history: History, *args: Any, **kwargs: Any) -> Any:
        """Return the next untried value (NotFound when none remain)."""
        return self._get_next_value(self._values, history)


class ParameterizedForEach(ForEachBase):
    """Like ForEach, but the values come from the ``values`` requirement at run time."""

    def on_failure(  # type: ignore[override]
        self,
        values: Sequence[Any],
        history: History,
        *args: Any,
        **kwargs: Any,
    ) -> Decision:
        """RETRY while untried values remain, then revert."""
        return self._on_failure(values, history)

    def execute(  # type: ignore[override]
        self,
        values: Sequence[Any],
        history: History,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Return the next untried value (NotFound when none remain)."""
        return self._get_next_value(values, history)
