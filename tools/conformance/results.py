"""Fold the plugin's JSON lines into one outcome per test, and per module."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rewriting import SCAFFOLD_PACKAGE

UNIT_PREFIX = f"{SCAFFOLD_PACKAGE}/tests/unit/"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def test_id(nodeid: str) -> str:
    """``tfconformance/tests/unit/x/test_y.py::C::t`` -> ``x/test_y.py::C::t``."""
    return nodeid[len(UNIT_PREFIX) :] if nodeid.startswith(UNIT_PREFIX) else nodeid


def module_of(test: str) -> str:
    """``persistence/test_dir_persistence.py::C::t`` -> ``persistence.test_dir_persistence``."""
    path = test.split("::", 1)[0]
    return path.removesuffix(".py").replace("/", ".")


@dataclass
class RunResults:
    """Outcome of every test a run reached, and the modules that did not import."""

    outcomes: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    broken_modules: dict[str, str] = field(default_factory=dict)

    def passed(self) -> set[str]:
        return {test for test, outcome in self.outcomes.items() if outcome == PASSED}


# pytest cannot render testtools' failures natively and says so first; the
# report proper follows this marker.
_TESTTOOLS_MARKER = "testtools.testresult.real._StringException: "


def _readable(longrepr: str) -> str:
    head, marker, rest = longrepr.partition(_TESTTOOLS_MARKER)
    return rest if marker else head


def load(path: Path) -> RunResults:
    """Read the plugin's file: a test failed if any phase failed, skipped if any skipped."""
    results = RunResults()
    if not path.exists():
        return results
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        test = test_id(entry["nodeid"])
        if entry["when"] == "collect":
            results.broken_modules[module_of(test)] = _readable(entry.get("longrepr", ""))
            continue
        outcome = entry["outcome"]
        previous = results.outcomes.get(test)
        if outcome == FAILED or previous == FAILED:
            results.outcomes[test] = FAILED
            if outcome == FAILED:
                results.details.setdefault(test, _readable(entry.get("longrepr", "")))
        elif outcome == SKIPPED or previous == SKIPPED:
            results.outcomes[test] = SKIPPED
            if "reason" in entry:
                results.details.setdefault(test, entry["reason"])
        else:
            results.outcomes[test] = PASSED
    return results
