"""Task executors: futures resolve to (outcome, result|Failure) and never raise."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from flowengine import task
from flowengine.engines.action_engine import executor as ex
from flowengine.engines.action_engine import process_executor as pe
from flowengine.types import failure as ft

WAIT_S = 10.0


class Doubler(task.Task):
    """Reports progress, returns 2 * x; revert returns what it got."""

    def execute(self, x):
        self.update_progress(0.5)
        return 2 * x

    def revert(self, x, result, flow_failures):
        return {"x": x, "result": result, "failures": sorted(flow_failures)}


class Broken(task.Task):
    """Raises ValueError."""

    def execute(self):
        raise ValueError("broken")


@pytest.fixture(
    params=[
        "serial",
        "threads",
        # a process pool: out of the fast tier (tests/fast_tier.py)
        pytest.param("processes", marks=pytest.mark.broker),
    ]
)
def executor(request):
    chosen = {
        "serial": ex.SerialTaskExecutor,
        "threads": lambda: ex.ParallelThreadTaskExecutor(max_workers=2),
        "processes": lambda: pe.ParallelProcessTaskExecutor(max_workers=1),
    }[request.param]()
    chosen.start()
    yield chosen
    chosen.stop()


def test_execute_resolves_to_executed_result(executor):
    events = []
    fut = executor.execute_task(
        Doubler("d"),
        "uuid-1",
        {"x": 3},
        progress_callback=lambda e, details: events.append((e, details)),
    )
    assert fut.result(timeout=WAIT_S) == (ex.EXECUTED, 6)
    assert events == [(ex.EVENT_UPDATE_PROGRESS, {"progress": 0.5})]


def test_execute_failure_is_captured(executor):
    outcome, result = executor.execute_task(Broken("b"), "uuid-2", {}).result(timeout=WAIT_S)
    assert outcome == ex.EXECUTED
    assert isinstance(result, ft.Failure)
    assert result.check(ValueError)
    with pytest.raises(ValueError, match="broken"):
        result.reraise()


def test_revert_gets_result_and_failures(executor):
    failure = ft.Failure.from_exception(RuntimeError("earlier"))
    fut = executor.revert_task(Doubler("d"), "uuid-3", {"x": 1}, 2, {"other": failure})
    outcome, result = fut.result(timeout=WAIT_S)
    assert outcome == ex.REVERTED
    assert result == {"x": 1, "result": 2, "failures": ["other"]}


def test_progress_callback_only_registered_while_running():
    t = Doubler("d")
    ex.execute_task(t, {"x": 1}, progress_callback=lambda e, details: None)
    assert len(t.notifier) == 0


def test_thread_executor_does_not_stop_a_given_pool():
    with cf.ThreadPoolExecutor(max_workers=1) as pool:
        executor = ex.ParallelThreadTaskExecutor(executor=pool)
        executor.start()
        assert executor.execute_task(Doubler("d"), "u", {"x": 2}).result(WAIT_S)[1] == 4
        executor.stop()
        assert pool.submit(int, "7").result(WAIT_S) == 7


def test_thread_executor_restarts_after_stop():
    executor = ex.ParallelThreadTaskExecutor()
    for _ in range(2):
        executor.start()
        assert executor.execute_task(Doubler("d"), "u", {"x": 1}).result(WAIT_S)[1] == 2
        executor.stop()


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_unpicklable_task_fails_cleanly_in_processes():
    executor = pe.ParallelProcessTaskExecutor(max_workers=1)
    executor.start()
    try:
        local = task.FunctorTask(lambda: 1, name="lambda-task")
        outcome, result = executor.execute_task(local, "u", {}).result(timeout=WAIT_S)
    finally:
        executor.stop()
    assert outcome == ex.EXECUTED
    assert isinstance(result, ft.Failure)


def test_completed_future_behaves_as_a_resolved_future():
    import threading

    fut = ex.completed_future(("executed", 42))
    assert isinstance(fut, cf.Future)
    assert fut.done() and not fut.running() and not fut.cancelled()
    assert fut.result(timeout=0) == ("executed", 42)
    assert fut.exception(timeout=0) is None
    assert fut.cancel() is False
    seen = []
    fut.add_done_callback(seen.append)
    assert seen == [fut]  # called at once
    with pytest.raises(cf.InvalidStateError):
        fut.set_result(("executed", 0))
    # Waiting on resolved futures next to a pending one (several resolved
    # futures share one condition): wait and as_completed see them all.
    other = ex.completed_future(("executed", 1))
    pending: cf.Future = cf.Future()
    done, not_done = cf.wait([fut, other, pending], timeout=0)
    assert done == {fut, other} and not_done == {pending}
    threading.Thread(target=pending.set_result, args=[("executed", 2)]).start()
    done, not_done = cf.wait([fut, other, pending], return_when=cf.ALL_COMPLETED, timeout=WAIT_S)
    assert not not_done
    assert {f.result()[1] for f in cf.as_completed([fut, other, pending])} == {42, 1, 2}
    # Resolved futures share one waiter list (no list per task); wait() and
    # as_completed() took out every waiter they put on it.
    assert fut._waiters is other._waiters
    assert fut._waiters == []
