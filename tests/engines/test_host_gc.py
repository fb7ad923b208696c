"""A library leaves its host's garbage collector as it found it (issue 37).

In a fresh process (nothing has allowed flowengine to tune the collector), a
host freezes its own objects and keeps the collector on; flows are built and
run on every engine; the host's frozen objects stay frozen and the
collector stays on. (Before: every run ended with gc.unfreeze(), which
released the host's frozen objects too.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Out of the fast tier (tests/fast_tier.py): runs its host in a fresh Python process.
pytestmark = pytest.mark.broker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_HOST = textwrap.dedent("""
    import gc, json, sys
    from flowengine import engines, task
    from flowengine.patterns import graph_flow, linear_flow
    from tests.worker_based import executor_tasks as et
    from tests.worker_based.executor_helpers import MEMORY, running_worker, unique

    class Add(task.Task):
        def execute(self, x):
            return x + 1

    def flow():
        inner = graph_flow.Flow("g").add(Add("a", provides="y"),
                                         Add("b", rebind={"x": "y"}, provides="z"))
        return linear_flow.Flow("f").add(inner)

    host_objects = [[i] for i in range(5000)]  # the host's long-lived data
    gc.freeze()
    frozen = gc.get_freeze_count()
    seen = {}
    for engine in ("serial", "parallel"):
        engines.run(flow(), store={"x": 1}, engine=engine)
        seen[engine] = [gc.get_freeze_count(), gc.isenabled()]
    exchange = unique()
    with running_worker(exchange, "t", [et.Echo], **MEMORY):
        engines.run(linear_flow.Flow("r").add(et.Echo("e")), store={"value": 1},
                    engine="worker-based", exchange=exchange, topics=["t"], **MEMORY)
    seen["worker-based"] = [gc.get_freeze_count(), gc.isenabled()]
    print(json.dumps({"frozen": frozen, "seen": seen}))
""")


def test_runs_on_every_engine_leave_the_hosts_collector_as_it_was():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    env.pop("FLOWENGINE_GC_TUNING", None)
    proc = subprocess.run(
        [sys.executable, "-c", _HOST],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    frozen = report["frozen"]
    assert frozen > 5000
    for engine, (count, enabled) in report["seen"].items():
        # (a frozen object freed by its refcount leaves the count: a few may go)
        assert count > frozen * 0.9 and enabled, (engine, count, frozen)
