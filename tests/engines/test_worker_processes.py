"""The real-worker-process engine kinds really run tasks in the pool's processes."""

from __future__ import annotations

import os

import pytest

from flowengine import states
from flowengine.patterns import unordered_flow as uf
from tests.engines.conftest import ENGINE_KINDS, KIND_FIXTURES
from tests.worker_based import pool_tasks, process_pool

# The kinds backed by worker processes, with their marks (broker, ...).
PROCESS_KINDS = [
    k
    for k in ENGINE_KINDS
    if isinstance(k, type(pytest.param("x"))) and k.values[0] in KIND_FIXTURES
]


@pytest.mark.parametrize("engine_kind", PROCESS_KINDS, indirect=True)
def test_tasks_run_in_the_pool_processes(engine_kind, make_engine):
    # Given an engine kind backed by `flowengine worker` processes
    pids = {proc.pid for proc in process_pool.ACTIVE[engine_kind].procs}
    flow = uf.Flow("where").add(
        *[pool_tasks.WhereAmI(f"w{i}", provides=f"pid{i}") for i in range(8)]
    )
    # When a flow runs on it
    engine = make_engine(flow)
    engine.run()
    # Then every task ran in one of the pool's worker processes, not here
    assert engine.storage.get_flow_state() == states.SUCCESS
    ran_in = {engine.storage.fetch(f"pid{i}") for i in range(8)}
    assert ran_in <= pids and os.getpid() not in ran_in
