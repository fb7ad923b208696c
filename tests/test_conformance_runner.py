"""tools/conformance: the rewrite rules and a whole run on a small stand-in for TaskFlow's tests.

No network: the run uses a cache that already holds an "unpacked wheel"
written here, so fetching is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = REPO_ROOT / "tools" / "conformance"
RUN_TIMEOUT_S = 120

sys.path.insert(0, str(CONFORMANCE))
import classification  # noqa: E402
import probes  # noqa: E402
import rewriting  # noqa: E402


def test_scaffolding_moves_and_engine_imports_are_renamed():
    source = textwrap.dedent("""\
        from taskflow import test
        from taskflow.test import mock
        from taskflow.tests import utils as test_utils
        from taskflow.utils import eventlet_utils as eu
        from taskflow.patterns import linear_flow as lf
        import taskflow.engines
        PATCH = 'taskflow.engines.helpers.load'
    """)
    rewritten = rewriting.rewrite_source(source, "flowengine")
    assert "from tfconformance import test\n" in rewritten
    assert "from tfconformance.test import mock\n" in rewritten
    assert "from tfconformance.tests import utils as test_utils\n" in rewritten
    assert "from tfconformance import probes as eu\n" in rewritten
    assert "from flowengine.patterns import linear_flow as lf\n" in rewritten
    assert "import flowengine.engines\n" in rewritten
    assert "PATCH = 'flowengine.engines.helpers.load'" in rewritten
    assert "taskflow" not in rewritten


def test_baseline_target_keeps_taskflow_imports():
    rewritten = rewriting.rewrite_source("from taskflow import task, test\n", "taskflow")
    assert "from taskflow import task, test\n" in rewritten


def test_missing_engine_module_fails_only_its_users(monkeypatch):
    # In a work tree probes.py is tfconformance.probes; here it is imported directly.
    monkeypatch.setitem(sys.modules, "tfconformance", types.ModuleType("tfconformance"))
    monkeypatch.setitem(sys.modules, "tfconformance.probes", probes)
    source = "from flowengine.no_such_module import thing as other\nVALUE = 1\n"
    namespace: dict = {}
    exec(compile(rewriting.guard_engine_imports(source, "flowengine"), "m", "exec"), namespace)
    assert namespace["VALUE"] == 1
    with pytest.raises(ImportError, match="other.build is unavailable: No module named"):
        namespace["other"].build()


def test_private_name_tests_are_internal_in_public_modules():
    test = "test_states.py::TestStates::test_valid_flow_states"
    assert classification.kind_of("test_states") == classification.PUBLIC
    assert classification.kind_of_test("test_states", test) == classification.INTERNAL
    assert (
        classification.kind_of_test("test_states", "test_states.py::TestStates::test_states")
        == classification.PUBLIC
    )
    assert classification.kind_of("not_classified_yet") == classification.INTERNAL


_FAKE_TEST_PY = """\
import unittest


class TestCase(unittest.TestCase):
    pass
"""

_FAKE_UNIT_MODULE = """\
import testscenarios

from taskflow import states
from taskflow import test
from taskflow.types import no_such_module


class WithScenarios(testscenarios.TestWithScenarios, test.TestCase):
    scenarios = [("one", {"value": 1}), ("two", {"value": 2})]

    def test_value(self):
        self.assertIn(self.value, (1, 2))


class UsesMissing(test.TestCase):
    def test_missing(self):
        no_such_module.Thing()


class Plain(test.TestCase):
    def test_states(self):
        self.assertEqual("SUCCESS", states.SUCCESS)

    def test_fails(self):
        self.assertEqual(1, 2)


def test_module_function():
    pass
"""


def _fake_cache(root: Path) -> Path:
    tree = root / "taskflow-6.5.0-tests" / "taskflow"
    (tree / "tests" / "unit").mkdir(parents=True)
    (tree / "test.py").write_text(_FAKE_TEST_PY)
    for name in (
        "tests/__init__.py",
        "tests/utils.py",
        "tests/fixtures.py",
        "tests/unit/__init__.py",
    ):
        (tree / name).write_text("")
    (tree / "tests" / "unit" / "test_fake.py").write_text(_FAKE_UNIT_MODULE)
    (root / "taskflow-6.5.0-tests" / ".complete").write_text("fake\n")
    return root


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_whole_run_expands_scenarios_and_reports(tmp_path):
    pytest.importorskip("testscenarios")
    pytest.importorskip("pytest_timeout")
    cache = _fake_cache(tmp_path / "cache")
    env = dict(os.environ, FLOWENGINE_CONFORMANCE_CACHE=str(cache), PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, str(CONFORMANCE / "run.py"), "--keep-work"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"flowengine from {REPO_ROOT / 'flowengine'}"
    assert lines[-1] == "conformance: 0 passed, 0 failed of 0"
    module_line = next(line for line in lines if line.startswith("test_fake "))
    assert module_line.split()[1:5] == ["internal", "3", "2", "0"]
    work = Path(proc.stderr.split("work tree kept: ", 1)[1].split()[0])
    outcomes = {}
    for line in (work / "results.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["when"] == "call":
            outcomes[entry["nodeid"].rsplit("/", 1)[-1]] = entry
    assert sorted(outcomes) == [
        "test_fake.py::Plain::test_fails",
        "test_fake.py::Plain::test_states",
        "test_fake.py::UsesMissing::test_missing",
        "test_fake.py::WithScenarios[one]::test_value",
        "test_fake.py::WithScenarios[two]::test_value",
    ]
    assert (
        "no_such_module.Thing is unavailable"
        in (outcomes["test_fake.py::UsesMissing::test_missing"]["longrepr"])
    )
