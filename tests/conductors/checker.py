"""The conductor fault tests' checker: per job and task, done once, duplicated, or lost.

Reads the ledger the task bodies write (ledger_flows.py). A task *ran* when
it has an ``end`` record; runs cut short by a kill have a ``start`` only.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field


def read(path: str) -> list[dict]:
    """Every ledger record (none if the file does not exist yet)."""
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


@dataclass
class Verdict:
    """(job, task) keys counted by completed runs."""

    done_once: list[tuple[str, str]] = field(default_factory=list)
    duplicated: list[tuple[str, str]] = field(default_factory=list)
    lost: list[tuple[str, str]] = field(default_factory=list)
    #: Completed runs per key: [(pid, start, end)].
    runs: dict[tuple[str, str], list[tuple[int, float, float]]] = field(default_factory=dict)
    #: Starts without an end per key: [(pid, start)].
    cut: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)

    def overlapping(self) -> list[tuple[str, str]]:
        """Keys two of whose runs overlapped in time (a cut run counts until now)."""
        found = []
        for key in {*self.runs, *self.cut}:
            spans = [(start, end) for _, start, end in self.runs.get(key, [])]
            spans += [(start, float("inf")) for _, start in self.cut.get(key, [])]
            spans.sort()
            if any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])):
                found.append(key)
        return found

    def summary(self) -> str:
        return (
            f"done once {len(self.done_once)}, duplicated {len(self.duplicated)}"
            f" {self.duplicated[:5]}, lost {len(self.lost)} {self.lost[:5]}"
        )


def check(path: str, expected: list[tuple[str, str]]) -> Verdict:
    """Count each expected (job, task) in the ledger at ``path``."""
    opened: dict[tuple[str, str, int], float] = {}
    runs: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    for rec in sorted(read(path), key=lambda r: r["t"]):
        key = (rec["job"], rec["task"], rec["pid"])
        if rec["ev"] == "start":
            opened[key] = rec["t"]
        elif rec["ev"] == "end" and key in opened:
            runs[(rec["job"], rec["task"])].append((rec["pid"], opened.pop(key), rec["t"]))
    verdict = Verdict(runs=dict(runs))
    for (job, task_name, pid), start in opened.items():
        verdict.cut.setdefault((job, task_name), []).append((pid, start))
    for key in expected:
        n = len(runs.get(key, []))
        (verdict.done_once if n == 1 else verdict.lost if n == 0 else verdict.duplicated).append(
            key
        )
    return verdict
