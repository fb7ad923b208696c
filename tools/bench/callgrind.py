"""Instruction counts of a benchmark's phases with valgrind's callgrind.

Wall and CPU times of a shared machine move with its load; the number of
instructions a phase executes does not. :func:`count` runs a child command
under callgrind once per phase, each run stopping after one more phase
(``--stop-after PHASE``); the difference between consecutive runs is that
phase's count, so Python's start-up and the imports cancel out.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from typing import Any, TextIO

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def count(
    child: list[str], phases: tuple[str, ...], tasks: int, timeout_s: float, cwd: str
) -> dict[str, Any]:
    """``{'<phase>_instr_per_task': float}`` for every phase after the first, or an error.

    ``child`` is the command of one case; it must accept ``--stop-after PHASE``.
    """
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return {"error": "valgrind is not installed (apt-get install valgrind)"}
    totals = []
    for phase in phases:
        cmd = [
            valgrind,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            *child,
            "--stop-after",
            phase,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
        except subprocess.TimeoutExpired:
            return {"error": f"callgrind: timeout after {timeout_s:.0f} s"}
        found = _COLLECTED.findall(proc.stderr)
        if proc.returncode != 0 or not found:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return {"error": f"callgrind: exit {proc.returncode}: {last}"}
        totals.append(int(found[-1]))
    return {
        "tasks": tasks,
        "phases": list(phases[1:]),
        **{
            f"{phase}_instr_per_task": (totals[i] - totals[i - 1]) / tasks
            for i, phase in enumerate(phases)
            if i
        },
    }


def print_table(rows: list[dict[str, Any]], out: TextIO = sys.stdout) -> None:
    """One row per case and library: thousands of instructions per task, per phase."""
    phases = next((r["phases"] for r in rows if "phases" in r), [])
    print(
        "\nInstructions per task, thousands (callgrind; tasks do nothing, so the run's"
        " figure is engine overhead)",
        file=out,
    )
    head = f"{'case':<12} {'engine':<9} {'lib':<11}" + "".join(f" {p:>9}" for p in phases)
    print(head + "\n" + "-" * len(head), file=out)
    for r in rows:
        lead = f"{r['case']:<12} {r['engine']:<9} {r['lib']:<11}"
        if "error" in r:
            print(f"{lead} ERROR {r['error']}", file=out)
            continue
        print(
            lead + "".join(f" {r[f'{p}_instr_per_task'] / 1000:>8.1f}k" for p in phases), file=out
        )
