"""pytest plugin for a conformance work tree (copied there as conftest.py).

* Expands testscenarios classes the way stestr does: one test class per
  scenario, collected as ``Class[scenario]``, so each scenario is its own test.
* Records each test's outcome (and each collection error) as JSON lines in
  the file named by ``FLOWENGINE_CONFORMANCE_RESULTS``.
"""

from __future__ import annotations

import inspect
import json
import os
import unittest

import pytest
from _pytest.unittest import UnitTestCase

RESULTS_ENV = "FLOWENGINE_CONFORMANCE_RESULTS"
#: JSON list of "module::method" tests to deselect (internal ones that would only time out).
NOT_RUN_ENV = "FLOWENGINE_CONFORMANCE_NOT_RUN"


def _scenario_classes(name: str, cls: type) -> list[tuple[str, type]]:
    classes = []
    for scenario_name, params in cls.scenarios:
        attributes = dict(params)
        # The expanded class is one scenario: testscenarios must not multiply it again.
        attributes.update(scenarios=None, __module__=cls.__module__, __qualname__=name)
        classes.append((f"{name}[{scenario_name}]", type(name, (cls,), attributes)))
    return classes


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(
    collector: pytest.Collector, name: str, obj: object
) -> list[UnitTestCase] | None:
    """Collect a scenario class as one test class per scenario."""
    if not (inspect.isclass(obj) and issubclass(obj, unittest.TestCase)):
        return None
    if not getattr(obj, "scenarios", None) or not getattr(obj, "__test__", True):
        return None
    items = []
    for item_name, cls in _scenario_classes(name, obj):
        item = UnitTestCase.from_parent(collector, name=item_name)
        # pytest looks the class up by name in the module; this one is not there.
        item._obj = cls
        items.append(item)
    return items


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests the runner names in NOT_RUN_ENV."""
    names = set(json.loads(os.environ.get(NOT_RUN_ENV) or "[]"))
    if not names:
        return
    kept, dropped = [], []
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        module = path.split("tests/unit/", 1)[-1].removesuffix(".py").replace("/", ".")
        method = item.name.split("[", 1)[0]
        (dropped if f"{module}::{method}" in names else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _record(entry: dict) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per test phase; the runner folds them into one outcome."""
    entry = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome}
    if report.failed:
        entry["longrepr"] = str(report.longrepr)[-4000:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        entry["reason"] = str(report.longrepr[2])
    _record(entry)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module that fails to import fails every test the baseline expects of it."""
    if report.failed:
        _record(
            {
                "nodeid": report.nodeid,
                "when": "collect",
                "outcome": "failed",
                "longrepr": str(report.longrepr)[-4000:],
            }
        )
