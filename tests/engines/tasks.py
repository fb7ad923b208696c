"""Task classes for the behaviour suite (module level, importable, JSON-friendly).

Tasks keep no state the engine must see: tests observe runs through the
engine's notifiers and storage, which stay in the engine's process whatever
executor runs the tasks. A remote worker builds a task from its class with
only a name (as TaskFlow's workers do), so no task takes constructor
arguments: settings come in as injected arguments (see the helpers below).
"""

from __future__ import annotations

from typing import Any

from flowengine import task


class Noop(task.Task):
    """Does nothing."""

    def execute(self) -> None:
        return None


class Constant(task.Task):
    """Returns its ``value`` argument (see :func:`constant`)."""

    def execute(self, value: Any) -> Any:
        return value


def constant(value: Any, name: str, **kwargs: Any) -> Constant:
    """A Constant task returning ``value``."""
    return Constant(name=name, inject={"value": value}, **kwargs)


class Adder(task.Task):
    """Returns x + y."""

    def execute(self, x: Any, y: Any) -> Any:
        return x + y


class AddOneSame(task.Task):
    """Returns value + 1, provided again as 'value'."""

    default_provides = "value"

    def execute(self, value: Any) -> Any:
        return value + 1


class Multiplier(task.Task):
    """Returns z * factor (factor defaults to 2)."""

    def execute(self, z: Any, factor: Any = 2) -> Any:
        return z * factor


class Fail(task.Task):
    """Always raises RuntimeError('Woot from <name>')."""

    def execute(self, **kwargs: Any) -> None:
        raise RuntimeError(f"Woot from {self.name}")


class FailOnRevert(task.Task):
    """Succeeds, but its revert raises RuntimeError."""

    def execute(self) -> int:
        return 1

    def revert(self, **kwargs: Any) -> None:
        raise RuntimeError(f"Revert woot from {self.name}")


class FailUntil(task.Task):
    """Fails unless ``attempt`` (a retry's value) equals ``succeed_on``."""

    default_provides = "outcome"

    def execute(self, attempt: Any, succeed_on: Any) -> Any:
        if attempt != succeed_on:
            raise RuntimeError(f"{self.name} failed on attempt {attempt!r}")
        return f"ok on {attempt}"


def fail_until(succeed_on: Any, name: str, **kwargs: Any) -> FailUntil:
    """A FailUntil task that succeeds when ``attempt == succeed_on``."""
    return FailUntil(name=name, inject={"succeed_on": succeed_on}, **kwargs)


class RevertReporter(task.Task):
    """Returns 'done'; its revert returns what the engine passed it (JSON)."""

    def execute(self) -> str:
        return "done"

    def revert(self, result: Any, flow_failures: Any, **kwargs: Any) -> dict:
        if hasattr(result, "exception_str"):
            result = "failure: " + result.exception_str
        return {"result": result, "flow_failures": sorted(flow_failures)}


class FailingReporter(RevertReporter):
    """A RevertReporter whose execute fails."""

    def execute(self) -> str:
        raise RuntimeError(f"Woot from {self.name}")


class Progress(task.Task):
    """Reports progress 0.25, 0.5 and 0.75 while it runs."""

    def execute(self) -> str:
        for p in (0.25, 0.5, 0.75):
            self.update_progress(p)
        return "progressed"


class Pair(task.Task):
    """Returns ``list(range(count))`` (for checking multi-value provides)."""

    def execute(self, count: int) -> list:
        return list(range(count))


def pair(count: int, name: str, **kwargs: Any) -> Pair:
    """A Pair task returning ``count`` items."""
    return Pair(name=name, inject={"count": count}, **kwargs)
