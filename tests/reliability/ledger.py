"""The fault tests' checker: how often each request's task body ran."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

#: Seconds between two looks at a ledger file while waiting for it to grow:
#: the file is the signal the task bodies give; short enough to react fast.
POLL_S = 0.02


def counts(path: str) -> collections.Counter:
    """Token -> how many times a task body recorded it."""
    if not os.path.exists(path):
        return collections.Counter()
    with open(path, encoding="utf-8") as fh:
        return collections.Counter(line.strip() for line in fh if line.strip())


def wait_lines(path: str, at_least: int, timeout_s: float) -> bool:
    """Wait (bounded) until the ledger holds ``at_least`` lines."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(counts(path).values()) >= at_least:
            return True
        time.sleep(POLL_S)
    return False


@dataclass
class Verdict:
    """Each expected request counted: done once, duplicated, or lost; plus strays."""

    done_once: int
    duplicated: list[str]
    lost: list[str]
    unexpected: list[str]

    def __str__(self) -> str:
        return (
            f"done once {self.done_once}, duplicated {len(self.duplicated)}"
            f" {self.duplicated[:5]}, lost {len(self.lost)} {self.lost[:5]},"
            f" unexpected {self.unexpected[:5]}"
        )


def check(path: str, expected: Iterable[str]) -> Verdict:
    """Count each expected token in the ledger at ``path``."""
    seen = counts(path)
    expected = list(expected)
    wanted = set(expected)
    return Verdict(
        done_once=sum(1 for t in expected if seen[t] == 1),
        duplicated=[t for t in expected if seen[t] > 1],
        lost=[t for t in expected if seen[t] == 0],
        unexpected=sorted(t for t in seen if t not in wanted),
    )
