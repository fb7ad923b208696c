"""Task progress: reported to storage and to atom_notifier listeners."""

from __future__ import annotations

import pytest

from flowengine import states
from flowengine.patterns import linear_flow as lf
from flowengine.persistence import helpers as p_utils
from flowengine.persistence.backends import impl_memory
from tests.engines import tasks
from tests.engines.observe import Recorder, run_expecting_failure


def test_progress_reaches_listeners_and_storage(make_engine):
    engine = make_engine(lf.Flow("prog").add(tasks.Progress("p")))
    rec = Recorder(engine)
    engine.run()
    assert rec.progress == [("p", 0.25), ("p", 0.5), ("p", 0.75)]
    # Finishing sets progress to 1.0
    assert engine.storage.get_task_progress("p") == 1.0
    assert rec.states_of("p") == [states.RUNNING, states.SUCCESS]


def test_progress_without_details_stores_none_details(make_engine):
    # TaskFlow records 'progress_details' as None on every detail-less
    # update, so the key is always present in the task's metadata.
    backend = impl_memory.MemoryBackend()
    _book, flow_detail = p_utils.temporary_flow_detail(backend)
    engine = make_engine(
        lf.Flow("prog").add(tasks.Progress("p")), flow_detail=flow_detail, backend=backend
    )
    engine.run()
    detail = flow_detail.find(engine.storage.get_atom_uuid("p"))
    assert detail.meta["progress"] == 1.0
    assert "progress_details" in detail.meta
    assert detail.meta["progress_details"] is None


def test_progress_event_details(make_engine):
    engine = make_engine(lf.Flow("prog").add(tasks.Progress("p")))
    seen = []
    engine.atom_notifier.register("update_progress", lambda event, details: seen.append(details))
    engine.run()
    assert seen[0]["task_name"] == "p"
    assert seen[0]["task_uuid"] == engine.storage.get_atom_uuid("p")
    assert seen[0]["progress"] == 0.25


def test_progress_reset_when_task_reverted(make_engine):
    engine = make_engine(lf.Flow("prog").add(tasks.Progress("p"), tasks.Fail("boom")))
    run_expecting_failure(engine)
    assert engine.storage.get_atom_state("p") == states.REVERTED
    assert engine.storage.get_task_progress("p") == 1.0


def test_no_progress_listener_no_events(make_engine):
    engine = make_engine(lf.Flow("quiet").add(tasks.Noop("n")))
    rec = Recorder(engine)
    engine.run()
    assert rec.progress == []


@pytest.mark.in_process
def test_engine_reports_start_and_end_on_the_task_notifier(make_engine):
    # The engine fires 0.0 when the task starts and 1.0 when it finishes
    fired = []
    t = tasks.Noop("quiet")
    t.notifier.register("update_progress", lambda event, details: fired.append(details["progress"]))
    make_engine(lf.Flow("auto").add(t)).run()
    assert fired == [0.0, 1.0]
