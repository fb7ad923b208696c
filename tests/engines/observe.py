"""Recording what an engine reports on its notifiers (any engine kind)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from flowengine import exceptions
from flowengine.types import notifier as nt


class Recorder:
    """Collects (name, state) pairs of atom and flow notifications."""

    def __init__(self, engine: Any) -> None:
        self.atoms: list[tuple[str, str]] = []
        self.flow: list[str] = []
        self.details: list[tuple[str, dict]] = []
        self.progress: list[tuple[str, float]] = []
        engine.atom_notifier.register(nt.Notifier.ANY, self._on_atom)
        engine.notifier.register(nt.Notifier.ANY, self._on_flow)

    def _on_atom(self, state: str, details: dict) -> None:
        name = details.get("task_name") or details.get("retry_name")
        if state == "update_progress":
            self.progress.append((name, details["progress"]))
            return
        self.atoms.append((name, state))
        self.details.append((state, dict(details)))

    def _on_flow(self, state: str, details: dict) -> None:
        self.flow.append(state)

    def states_of(self, name: str) -> list[str]:
        """States atom ``name`` went through, in order."""
        return [s for n, s in self.atoms if n == name]

    def count(self, name: str, state: str) -> int:
        """How many times atom ``name`` entered ``state``."""
        return sum(1 for n, s in self.atoms if n == name and s == state)

    def order(self, state: str) -> list[str]:
        """Atom names in the order they entered ``state``."""
        return [n for n, s in self.atoms if s == state]


@contextlib.contextmanager
def raises_failure(exc_type: type[BaseException], match: str | None = None) -> Iterator[None]:
    """Like ``pytest.raises`` for a task's exception, on any engine.

    Engines whose tasks run in another process may only have the failure's
    description (not the exception object): they raise WrappedFailure holding
    it, as TaskFlow's worker-based engine does. Both forms are accepted.
    """
    try:
        yield
    except exceptions.WrappedFailure as wrapped:
        matching = [f for f in wrapped if f.check(exc_type)]
        assert matching, f"{wrapped} holds no {exc_type.__name__}"
        if match is not None:
            assert any(re.search(match, f.exception_str) for f in matching), (
                f"no failure in {wrapped} matches {match!r}"
            )
    except exc_type as e:
        if match is not None:
            assert re.search(match, str(e)), f"{e!r} does not match {match!r}"
    else:
        pytest.fail(f"DID NOT RAISE {exc_type.__name__}")


def run_expecting_failure(engine: Any) -> None:
    """Run ``engine``, swallowing the task failure it is expected to re-raise."""
    with contextlib.suppress(RuntimeError, exceptions.WrappedFailure):
        engine.run()
