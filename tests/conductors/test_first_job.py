"""A conductor of local engines never imports the worker-based engine's messaging (issue 38).

The broker options a job may name are only looked at when the conductor
has a broker of its own to give way: otherwise kombu (60 ms of imports
here) landed inside the first job of every conductor process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: One job with engine options of its own, run by a blocking conductor on
#: a memory board; prints which of the watched modules got imported.
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from flowengine import engines
    from flowengine.conductors import backends as conductors
    from flowengine.jobs import backends as boards
    from flowengine.persistence.backends import impl_memory
    from flowengine.utils import persistence_utils as pu
    from tests.conductors import flows

    persistence = impl_memory.MemoryBackend()
    board = boards.fetch("b", {"board": "memory://?namespace=first"}, persistence=persistence)
    board.connect()
    lb, fd = pu.temporary_flow_detail(persistence)
    engines.save_factory_details(fd, flows.ok_factory, [], {}, backend=persistence)
    board.post("job", lb, details={"flow_uuid": fd.uuid, "engine_options": {"x": 1}})
    conductor = conductors.fetch("blocking", "c1", board, persistence=persistence)
    consumed = []
    conductor.notifier.register("job_consumed", lambda *_a, **_k: consumed.append(1))
    conductor.run(max_dispatches=1)
    watched = ("kombu", "flowengine.engines.worker_based.messaging.settings")
    imported = [m for m in watched if m in sys.modules]
    print(json.dumps({"consumed": len(consumed), "imported": imported}))
    """
)


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_job_of_a_local_engine_imports_no_messaging():
    # Given a blocking conductor of the default (local) engine, in a fresh process
    # When it runs a job whose details carry engine options
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # Then the job was consumed, and neither kombu nor the broker settings were imported
    assert report == {"consumed": 1, "imported": []}
