"""Suspending a run in progress and resuming it (same engine, or a new one)."""

from __future__ import annotations

from flowengine import states
from flowengine.patterns import linear_flow as lf
from flowengine.persistence import helpers as p_utils
from flowengine.persistence.backends import impl_memory
from tests.engines import tasks
from tests.engines.observe import Recorder, run_expecting_failure


def _flow():
    return lf.Flow("suspendable").add(
        tasks.constant(1, name="a", provides="x"),
        tasks.constant(2, name="b", provides="y"),
        tasks.Adder("c", provides="z"),
    )


def _suspend_when(engine, atom_name):
    def on_success(state, details):
        if details.get("task_name") == atom_name:
            engine.suspend()

    engine.atom_notifier.register(states.SUCCESS, on_success)
    return on_success


def test_suspend_and_resume_same_engine(make_engine):
    # Given an engine asked to suspend once 'a' has succeeded
    engine = make_engine(_flow())
    rec = Recorder(engine)
    callback = _suspend_when(engine, "a")
    # When it runs, it stops SUSPENDED with only 'a' done
    engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert rec.order(states.SUCCESS) == ["a"]
    assert engine.storage.get_atom_state("b") == states.PENDING
    # And running it again finishes the rest, without re-running 'a'
    engine.atom_notifier.deregister(states.SUCCESS, callback)
    engine.run()
    assert rec.order(states.RUNNING) == ["a", "b", "c"]
    assert engine.storage.fetch("z") == 3
    assert rec.flow == [
        states.RUNNING,
        states.SUSPENDING,
        states.SUSPENDED,
        states.RUNNING,
        states.SUCCESS,
    ]


def test_resume_in_a_new_engine_from_the_backend(make_engine):
    backend = impl_memory.MemoryBackend()
    book = p_utils.temporary_log_book(backend)
    flow_detail = p_utils.create_flow_detail(_flow(), book=book, backend=backend)
    first = make_engine(_flow(), flow_detail=flow_detail, backend=backend)
    _suspend_when(first, "b")
    first.run()
    assert first.storage.get_flow_state() == states.SUSPENDED
    # A new engine over the same flow detail picks up where the first stopped
    second = make_engine(_flow(), flow_detail=flow_detail, backend=backend)
    rec = Recorder(second)
    second.run()
    assert rec.order(states.RUNNING) == ["c"]
    assert second.storage.fetch("z") == 3
    assert second.storage.get_flow_state() == states.SUCCESS


def test_run_iter_send_true_suspends(make_engine):
    engine = make_engine(_flow())
    it = engine.run_iter()
    seen = []
    for state in it:
        seen.append(state)
        if state == states.ANALYZING:
            break
    try:
        state = it.send(True)
        seen.append(state)
        seen.extend(it)
    except StopIteration:
        pass
    assert seen[-1] == states.SUSPENDED
    assert engine.storage.get_flow_state() == states.SUSPENDED
    engine.run()
    assert engine.storage.fetch("z") == 3


def test_closing_run_iter_suspends(make_engine):
    engine = make_engine(_flow())
    it = engine.run_iter()
    assert next(it) == states.RESUMING
    it.close()
    assert engine.storage.get_flow_state() == states.SUSPENDED


def test_suspend_while_reverting_resumes_the_revert(make_engine):
    flow = lf.Flow("rev-suspend").add(tasks.Noop("a"), tasks.Noop("b"), tasks.Fail("boom"))
    engine = make_engine(flow)
    rec = Recorder(engine)

    def on_reverted(state, details):
        if details.get("task_name") == "boom":
            engine.suspend()

    engine.atom_notifier.register(states.REVERTED, on_reverted)
    engine.run()  # suspended: no failure raised
    assert engine.storage.get_flow_state() == states.SUSPENDED
    engine.atom_notifier.deregister(states.REVERTED, on_reverted)
    run_expecting_failure(engine)
    assert rec.order(states.REVERTED) == ["boom", "b", "a"]
    assert engine.storage.get_flow_state() == states.REVERTED


def test_resume_after_crash_reruns_the_interrupted_task(make_engine):
    # Given a flow detail saved while 'b' was RUNNING (the process died then)
    backend = impl_memory.MemoryBackend()
    book = p_utils.temporary_log_book(backend)
    flow_detail = p_utils.create_flow_detail(_flow(), book=book, backend=backend)
    first = make_engine(_flow(), flow_detail=flow_detail, backend=backend)
    _suspend_when(first, "a")
    first.run()
    first.storage.set_atom_state("b", states.RUNNING)
    # When a new engine resumes it
    second = make_engine(_flow(), flow_detail=flow_detail, backend=backend)
    rec = Recorder(second)
    second.run()
    # Then 'b' ran again, 'a' did not, and the flow finished
    assert rec.order(states.SUCCESS) == ["b", "c"]
    assert second.storage.fetch("z") == 3
