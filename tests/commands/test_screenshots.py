"""tools/screenshots.py draws the pictures the docs include."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from flowengine.engines.action_engine import graph_draw
from tests.worker_based.test_cli import ROOT, _env

# Out of the fast tier (tests/fast_tier.py): runs tools/screenshots.py in a process of its own.
pytestmark = pytest.mark.broker


def test_screenshots_script_writes_the_events_view_the_flow_graph_and_the_dashboard(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "screenshots.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    view = ET.parse(tmp_path / "events-view.svg").getroot()
    text = "".join(t.text or "" for t in view.iter("{http://www.w3.org/2000/svg}text"))
    text = text.replace("\xa0", " ")
    assert "Workers" in text and "Requests" in text and "SUCCESS" in text
    assert (tmp_path / "demo-flow.dot").read_text().startswith("digraph flow {")
    if graph_draw.dot_program() is not None:
        assert ET.parse(tmp_path / "demo-flow.svg").getroot().tag.endswith("svg")
    if _can_photograph():
        # The dashboard, photographed by a headless Chromium: real PNG pictures.
        for name in (
            "dashboard-idle.png",
            "dashboard.png",
            "dashboard-flow.png",
            "dashboard-history.png",
        ):
            assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    else:
        assert "dashboard pictures not taken" in proc.stderr


def _can_photograph() -> bool:
    """Whether playwright, the dashboard extra and Debian's Chromium are all here."""
    import importlib.util

    return all(
        importlib.util.find_spec(m) is not None for m in ("playwright", "starlette", "uvicorn")
    ) and os.path.exists("/usr/bin/chromium")
