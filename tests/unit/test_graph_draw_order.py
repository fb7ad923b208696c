"""A flow is drawn the same way in every process: its members in declared order."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Out of the fast tier (tests/fast_tier.py): runs Python processes with other hash seeds.
pytestmark = pytest.mark.broker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_DRAW = textwrap.dedent("""
    from flowengine import task
    from flowengine.engines.action_engine import graph_draw
    from flowengine.patterns import graph_flow, linear_flow, unordered_flow

    class T(task.Task):
        def execute(self, **kwargs):
            pass

    layer = unordered_flow.Flow("layer").add(*[T(f"step-{i:02d}") for i in range(12)])
    # A graph flow whose links come from provides/requires (sets inside).
    fan = graph_flow.Flow("fan").add(
        T("source", provides="x"),
        *[T(f"leaf-{i:02d}", requires=["x"], provides=f"y{i}") for i in range(12)],
        T("sink", requires=[f"y{i}" for i in range(12)]))
    flow = linear_flow.Flow("outer").add(T("first"), layer, fan, T("last"))
    print(graph_draw.to_dot(flow))
""")


def _dot(hash_seed: str) -> str:
    env = dict(
        os.environ,
        PYTHONHASHSEED=hash_seed,
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _DRAW], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_same_flow_gives_the_same_dot_whatever_the_hash_seed():
    drawings = {_dot(seed) for seed in ("0", "1", "2", "3")}
    assert len(drawings) == 1
    dot = drawings.pop()
    # and a layer's nodes come as they were added
    for prefix in ("step", "leaf"):
        positions = [dot.index(f'"{prefix}-{i:02d}') for i in range(12)]
        assert positions == sorted(positions), prefix
