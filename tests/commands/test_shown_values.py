"""Values as commands show them: injected secrets masked, failures readable."""

from __future__ import annotations

import uuid

from flowengine.commands.flows import views
from flowengine.persistence import models
from flowengine.storage.base import StorageBase


def _flow_with_store(store):
    fd = models.FlowDetail("f", str(uuid.uuid4()))
    injector = models.TaskDetail(StorageBase.injector_name, str(uuid.uuid4()))
    injector.results = store
    fd.add(injector)
    return fd


def test_injected_secrets_are_masked_unless_revealed():
    fd = _flow_with_store({"db_password": "hunter2", "passenger": "Ann"})
    assert views.injected(fd) == {"db_password": "***", "passenger": "Ann"}
    assert views.show_view(None, fd)["injected"] == {"db_password": "***", "passenger": "Ann"}
    assert views.injected(fd, reveal=True) == {"db_password": "hunter2", "passenger": "Ann"}
    assert views.show_view(None, fd, reveal=True)["injected"]["db_password"] == "hunter2"


def test_a_failure_in_run_results_is_its_type_and_message():
    from flowengine.commands.running import jsonable
    from flowengine.types.failure import Failure

    failure = Failure.from_exception(RuntimeError("nope"))
    assert jsonable({"y": failure, "x": 1}) == {
        "y": {"failure": {"exc_type_names": ["RuntimeError", "Exception"], "message": "nope"}},
        "x": 1,
    }


def test_an_expired_request_is_named_by_uuid_action_and_task_not_by_its_state():
    from flowengine import task
    from flowengine.engines.worker_based.executor_side import housekeeper
    from flowengine.engines.worker_based.wire.request import Request

    class Charge(task.Task):
        def execute(self):
            pass

    request = Request(Charge("charge"), "r-1", "execute", {})
    request.transition_and_log_error("FAILURE")
    assert housekeeper._describe(request) == "r-1 (execute of 'charge')"
    assert [housekeeper._times(n) for n in (1, 3)] == ["once", "3 times"]
