"""SIGTERM / Ctrl-C during `flowengine run`: suspend cleanly, then stop now."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

# Out of the fast tier (tests/fast_tier.py): runs `flowengine run` in a process of its own.
pytestmark = pytest.mark.broker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Bounds the whole run (three one-second steps); a hang fails.
RUN_TIMEOUT_S = 60


def _start() -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowengine",
            "run",
            "tests.commands.slow_flows:three_steps",
            "--no-progress",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(proc: subprocess.Popen, text: str) -> list[str]:
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never came; stderr: {''.join(seen)}")


def test_sigterm_lets_the_running_task_finish_and_starts_no_other():
    # Given `flowengine run` running the first of three steps
    proc = _start()
    try:
        _wait_for(proc, "started s0")
        # When it receives SIGTERM
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Then the first step's result is kept, no later step ran, and it says so
    assert proc.returncode == 130, err
    assert json.loads(out) == {"r0": "s0"}
    assert "started s1" not in err
    assert "SIGTERM: no new task starts" in err
    assert "stopped by SIGTERM: the flow is SUSPENDED with 1 of 3 tasks done" in err
    assert "Traceback" not in err


def test_a_second_signal_stops_at_once():
    proc = _start()
    try:
        _wait_for(proc, "started s0")
        proc.send_signal(signal.SIGINT)
        _wait_for(proc, "SIGINT: no new task starts")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "flowengine run: interrupted" in err and "Traceback" not in err
