"""tools/conformance/real_users.py: its selection rule and its taskflow alias.

The whole run (a virtualenv of ~150 packages from PyPI) is CI's own step;
these check its two parts that decide what the step means, on stand-ins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = REPO_ROOT / "tools" / "conformance"
RUN_TIMEOUT_S = 60

sys.path.insert(0, str(CONFORMANCE))
import real_users_selection  # noqa: E402


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_selection_rule_on_a_stand_in_project(tmp_path):
    # Given a project whose glue module imports TaskFlow and whose other module
    # only reaches TaskFlow through the glue
    _write(tmp_path, "svc/__init__.py", "")
    _write(tmp_path, "svc/glue.py", "from taskflow import engines\n")
    _write(tmp_path, "svc/other.py", "from svc import glue\n")
    unit = "svc/tests/unit/"
    _write(tmp_path, unit + "test_direct.py", "import taskflow.engines\n")
    _write(
        tmp_path,
        unit + "test_patch.py",
        "from unittest import mock\n@mock.patch('taskflow.engines.load')\ndef f(m): pass\n",
    )
    _write(tmp_path, unit + "sub/test_user.py", "from svc import glue\n")
    _write(
        tmp_path,
        unit + "test_patch_user.py",
        "from unittest import mock\nP = mock.patch('svc.glue.Thing.method')\n",
    )
    _write(tmp_path, unit + "test_two_away.py", "from svc import other\n")
    _write(tmp_path, unit + "test_unrelated.py", "import json\nX = 'not.taskflow.here'\n")

    # When the rule selects
    selected = {s.module: s.reason for s in real_users_selection.select(tmp_path, "svc")}

    # Then direct imports, taskflow patch targets and (one level deep) users of
    # a TaskFlow-importing module are in; the rest is out
    assert selected == {
        "svc.tests.unit.test_direct": real_users_selection.IMPORTS_TASKFLOW,
        "svc.tests.unit.test_patch": real_users_selection.PATCHES_TASKFLOW,
        "svc.tests.unit.sub.test_user": real_users_selection.IMPORTS_USER.format(module="svc.glue"),
        "svc.tests.unit.test_patch_user": real_users_selection.IMPORTS_USER.format(
            module="svc.glue"
        ),
    }


ALIAS_PROBE = textwrap.dedent("""\
    import taskflow_alias  # installs the finder, as pytest's -p does
    from unittest import mock
    import flowengine.engines
    import taskflow.engines
    from taskflow.patterns import linear_flow
    from taskflow.persistence import backends
    import flowengine.patterns.linear_flow as fe_linear_flow
    import flowengine.persistence.backends as fe_backends

    assert taskflow.engines is flowengine.engines
    assert linear_flow is fe_linear_flow and backends is fe_backends
    # the module keeps its own identity (spec, name) under both names
    assert taskflow.engines.__spec__.name == "flowengine.engines"
    assert taskflow.engines.__name__ == "flowengine.engines"
    with mock.patch("taskflow.engines.load") as load:
        assert flowengine.engines.load is load
    try:
        import taskflow.no_such_module
    except ImportError as e:
        assert "flowengine.no_such_module" in str(e), e
    else:
        raise AssertionError("a module flowengine lacks imported")
    print("alias ok")
""")


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_alias_makes_taskflow_modules_the_flowengine_modules():
    # Given an interpreter where real TaskFlow may be installed too
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CONFORMANCE), str(REPO_ROOT)]))
    # When the alias is installed and taskflow modules are imported and patched
    proc = subprocess.run(
        [sys.executable, "-c", ALIAS_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
        cwd=REPO_ROOT,
    )
    # Then each taskflow.X is the flowengine.X module object itself
    assert proc.returncode == 0 and proc.stdout.strip() == "alias ok", proc.stderr
