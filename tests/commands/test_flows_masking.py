"""``flows show`` masks injected secrets by the rule job details follow."""

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
