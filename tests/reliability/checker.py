"""Counts each request of a fault test: done once, duplicated, or lost.

Reads the records the fault tasks write (see fault_tasks.py). An execution
is one (pid, attempt) start of a request; it *completed* when it has an
end (an ``abort`` record ends it without completing it: a fenced body).
Two executions of one request *overlap* when their intervals intersect;
an execution that never ended lasts until its process was killed (or for
ever when nobody killed it).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Execution:
    """One run of a request body in one process."""

    pid: int
    attempt: int | None
    start: float
    end: float | None = None
    #: It ended stopped half way (an ``abort`` record), not completed.
    aborted: bool = False


@dataclass
class Report:
    """Per-request verdicts of one fault test."""

    done_once: list[str] = field(default_factory=list)
    #: Completed more than once, one after the other (a re-run after a crash).
    duplicated: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    #: Two executions of the same request running at the same time.
    concurrent: list[str] = field(default_factory=list)
    #: Executions cut short by a kill (start, no end, process killed).
    killed: int = 0
    executions: dict[str, list[Execution]] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"done once {len(self.done_once)}, duplicated {len(self.duplicated)},"
            f" lost {len(self.lost)}, concurrent duplicates {len(self.concurrent)},"
            f" killed mid-run {self.killed}"
        )


def read_records(path: str) -> list[dict]:
    """Every record line of ``path`` (none if it does not exist yet)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def executions_by_name(records: list[dict]) -> dict[str, list[Execution]]:
    """Executions per task name, in start order."""
    runs: dict[str, list[Execution]] = defaultdict(list)
    open_runs: dict[tuple, Execution] = {}
    for rec in sorted(records, key=lambda r: r["t"]):
        key = (rec["name"], rec["pid"], rec["attempt"], rec["action"])
        if rec["ev"] == "start":
            run = Execution(rec["pid"], rec["attempt"], rec["t"])
            runs[rec["name"]].append(run)
            open_runs[key] = run
        elif rec["ev"] in ("end", "abort") and key in open_runs:
            run = open_runs.pop(key)
            run.end, run.aborted = rec["t"], rec["ev"] == "abort"
    return dict(runs)


def check(
    records: list[dict], expected: list[str], killed_at: dict[int, float] | None = None
) -> Report:
    """Count each expected request: done once, duplicated, lost; find overlaps.

    ``killed_at`` maps the pid of each killed worker to when (wall time) it
    was killed.
    """
    killed_at = killed_at or {}
    report = Report(executions=executions_by_name(records))
    for name in expected:
        runs = report.executions.get(name, [])
        completed = [r for r in runs if r.end is not None and not r.aborted]
        report.killed += sum(1 for r in runs if r.end is None and r.pid in killed_at)
        if not completed:
            report.lost.append(name)
        elif len(completed) == 1:
            report.done_once.append(name)
        else:
            report.duplicated.append(name)

        def finish(run: Execution) -> float:
            if run.end is not None:
                return run.end
            return killed_at.get(run.pid, math.inf)

        for i, a in enumerate(runs):
            if any(a.start < finish(b) and b.start < finish(a) for b in runs[i + 1 :]):
                report.concurrent.append(name)
                break
    return report
