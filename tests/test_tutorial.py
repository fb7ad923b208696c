"""The tutorial's remote-workers walk-through, run literally as a reader would.

The shell commands are read from doc/source/tutorial.rst itself and the
shop package from doc/examples/tutorial/ (which the tutorial includes), so
the tutorial cannot drift from what works.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUTORIAL = os.path.join(ROOT, "doc", "source", "tutorial.rst")
SHOP = os.path.join(ROOT, "doc", "examples", "tutorial", "shop")

#: Bounds the whole walk-through (it takes a few seconds): a hang fails.
WALKTHROUGH_TIMEOUT_S = 120

_COMMAND = re.compile(r"^\s+((?:flowengine|mkdir|kill) .*)$")


def tutorial_commands() -> list[str]:
    """The shell commands of the 'From a local flow to remote workers' steps, in order."""
    with open(TUTORIAL, encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("From a local flow to remote workers\n", 1)[1]
    steps = section.split("On several machines", 1)[0]
    return [m.group(1) for line in steps.splitlines() if (m := _COMMAND.match(line))]


def test_the_tutorial_names_the_commands_this_test_runs():
    commands = tutorial_commands()
    assert commands[0] == "flowengine run shop.flows:make_order --store passenger=ada"
    assert sum(c.startswith("flowengine worker ") for c in commands) == 2
    assert commands[-1] == "kill %1 %2"


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_the_tutorial_runs_literally(tmp_path):
    # Given the tutorial's files in a fresh folder
    shutil.copytree(SHOP, tmp_path / "shop", ignore=shutil.ignore_patterns("__pycache__"))
    script = "set -e\n" + "\n".join(tutorial_commands()) + "\nwait\n"
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    )
    # When a reader runs its commands in order
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=WALKTHROUGH_TIMEOUT_S,
    )
    # Then every step succeeds, locally and on the workers, with the same result
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count('"confirmation": "Confirmed 12A for ada, charged 120 EUR"') == 2
    assert (tmp_path / "order.dot").read_text().startswith("digraph")
    ran_remotely = re.findall(r"Task 'shop\.tasks\.(\w+)'.*finished in .*: SUCCESS", proc.stderr)
    assert sorted(ran_remotely) == ["ChargeCard", "ReserveSeat", "SendConfirmation"]
