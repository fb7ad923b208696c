"""Tracing is optional: without OpenTelemetry (or switched off) nothing imports it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.ops import helpers

# Out of the fast tier (tests/fast_tier.py): runs flows in fresh Python processes.
pytestmark = pytest.mark.broker


def run_untraced(*args: str, **environ: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.tracing.untraced_run", *args],
        capture_output=True,
        text=True,
        env=helpers.env(**environ),
        cwd=helpers.ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


EXPECTED_RESULTS = {"local": {"box": "packed"}, "remote": {"box": "packed"}}


def test_without_opentelemetry_flows_run_and_nothing_imports_it():
    # Given a process where opentelemetry cannot be imported (as if not installed)
    # When it runs a local and a remote flow
    seen = run_untraced("--hide")
    # Then both ran, and no opentelemetry module is loaded
    assert seen["results"] == EXPECTED_RESULTS
    assert seen["loaded"] == []
    # ... after one look at whether it is there (so the test hid something)
    assert seen["attempts"]


def test_switched_off_nothing_imports_it_even_when_installed():
    pytest.importorskip("opentelemetry.trace", reason="OpenTelemetry is not installed")
    # Given FLOWENGINE_TRACING=off, opentelemetry installed
    # When a process runs a local and a remote flow
    seen = run_untraced(FLOWENGINE_TRACING="off")
    # Then nothing loaded it
    assert seen["results"] == EXPECTED_RESULTS
    assert seen["loaded"] == []


def test_installed_it_is_used_by_the_same_flows():
    pytest.importorskip("opentelemetry.trace", reason="OpenTelemetry is not installed")
    # The control case: the same process, nothing hidden, loads it
    seen = run_untraced()
    assert seen["results"] == EXPECTED_RESULTS
    assert "opentelemetry.trace" in seen["loaded"]
