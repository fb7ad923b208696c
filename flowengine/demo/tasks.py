"""Demo tasks: small, deterministic and JSON-friendly, so any worker can run them."""

from __future__ import annotations

from flowengine import task


class Generate(task.Task):
    """Produce a few numbers from a seed (stands in for fetching a data source)."""

    def execute(self, seed: int) -> list[int]:
        """Return five numbers derived from ``seed``."""
        self.update_progress(0.5)
        return [seed * 10 + k for k in range(5)]


class Square(task.Task):
    """Square every number (stands in for a transformation step)."""

    def execute(self, values: list[int]) -> list[int]:
        """Return the squares of ``values``."""
        return [v * v for v in values]


class Total(task.Task):
    """Sum a list of numbers."""

    def execute(self, values: list[int]) -> int:
        """Return the sum of ``values``."""
        return sum(values)


class Combine(task.Task):
    """Add two partial totals (one level of a reduction tree)."""

    def execute(self, left: int, right: int) -> int:
        """Return ``left + right``."""
        return left + right


class Report(task.Task):
    """Turn the grand total into a one-line report."""

    def execute(self, total: int, sources: int) -> str:
        """Return a sentence naming the total and how many sources fed it."""
        return f"{sources} sources, sum of squares = {total}"
