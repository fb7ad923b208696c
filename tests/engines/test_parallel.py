"""What only the parallel engine does: run independent tasks at the same time."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from flowengine import engines, exceptions, states, task
from flowengine.engines.action_engine import executor as ex
from flowengine.patterns import linear_flow as lf
from flowengine.patterns import unordered_flow as uf
from tests.engines import tasks

# Bounded waits: a broken engine fails the test instead of hanging it.
WAIT_S = 5.0


class MeetAtBarrier(task.Task):
    """Waits at a barrier shared with its siblings (in-process only)."""

    def __init__(self, barrier: threading.Barrier, **kwargs) -> None:
        super().__init__(**kwargs)
        self.barrier = barrier

    def execute(self) -> int:
        return self.barrier.wait(timeout=WAIT_S)


def _barrier_flow(count):
    barrier = threading.Barrier(count)
    return uf.Flow("meet").add(*[MeetAtBarrier(barrier, name=f"t{i}") for i in range(count)])


@pytest.mark.parametrize("executor", [None, "threads", "threaded", "THREAD"])
def test_independent_tasks_run_concurrently(executor):
    # Three tasks that can only finish if all three run at the same time
    options = {} if executor is None else {"executor": executor}
    engine = engines.load(_barrier_flow(3), engine="parallel", max_workers=3, **options)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_user_supplied_executor_is_used_and_not_shut_down():
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        engine = engines.load(_barrier_flow(3), engine="parallel", executor=pool)
        engine.run()
        # Still usable: the engine did not shut down an executor it does not own
        assert pool.submit(lambda: 42).result(timeout=WAIT_S) == 42


def test_task_executor_instance_option():
    executor = ex.ParallelThreadTaskExecutor(max_workers=2)
    engine = engines.load(_barrier_flow(2), engine="parallel", executor=executor)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_process_executor_selected_by_pool_instance():
    with cf.ProcessPoolExecutor(max_workers=1) as pool:
        engine = engines.load(
            lf.Flow("p").add(tasks.constant(5, name="c", provides="v")),
            engine="parallel",
            executor=pool,
        )
        engine.run()
        assert engine.storage.fetch("v") == 5


def test_engine_refuses_concurrent_run():
    started = threading.Event()
    release = threading.Event()

    class Hold(task.Task):
        def execute(self):
            started.set()
            release.wait(WAIT_S)

    engine = engines.load(lf.Flow("hold").add(Hold("hold")), engine="parallel")
    runner = threading.Thread(target=engine.run)
    runner.start()
    try:
        assert started.wait(WAIT_S)
        with pytest.raises(exceptions.ExecutionFailure):
            engine.run()
    finally:
        release.set()
        runner.join(WAIT_S)
    assert engine.storage.get_flow_state() == states.SUCCESS


def test_suspend_from_another_thread_lets_running_tasks_finish():
    started = threading.Event()
    release = threading.Event()

    class Hold(task.Task):
        def execute(self):
            started.set()
            release.wait(WAIT_S)
            return "held"

    flow = lf.Flow("hold").add(Hold("hold", provides="h"), tasks.Noop("after"))
    engine = engines.load(flow, engine="parallel")
    runner = threading.Thread(target=engine.run)
    runner.start()
    assert started.wait(WAIT_S)
    engine.suspend()
    release.set()
    runner.join(WAIT_S)
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert engine.storage.fetch("h") == "held"
    assert engine.storage.get_atom_state("after") == states.PENDING
