"""The compat option where users set it (no TaskFlow needed for these)."""

from __future__ import annotations

import uuid

import pytest

from flowengine import cli
from flowengine.engines.worker_based.executor_side.engine import WorkerBasedActionEngine
from flowengine.engines.worker_based.messaging import compat
from flowengine.engines.worker_based.worker_side import worker as wkr


def test_cli_accepts_compat_taskflow_only(capsys):
    args = cli._build_parser().parse_args(
        ["worker", "--exchange", "e", "--topic", "t", "--tasks", "m", "--compat", "taskflow"]
    )
    assert args.compat == "taskflow"
    assert (
        cli._build_parser()
        .parse_args(["worker", "--exchange", "e", "--topic", "t", "--tasks", "m"])
        .compat
        is None
    )
    with pytest.raises(SystemExit) as info:
        cli.main(
            ["worker", "--exchange", "e", "--topic", "t", "--tasks", "m", "--compat", "celery"]
        )
    assert info.value.code == 2
    assert "--compat" in capsys.readouterr().err


def _topic_queue(worker: wkr.Worker):
    return next(q for q in worker.server.proxy.queues if not q.name.endswith(worker.worker_id))


def test_worker_declares_like_taskflow_only_in_compat_mode():
    plain = wkr.Worker(
        exchange=f"c-{uuid.uuid4().hex[:8]}", topic="t", tasks=[], transport="memory"
    )
    mixed = wkr.Worker(
        exchange=f"c-{uuid.uuid4().hex[:8]}",
        topic="t",
        tasks=[],
        transport="memory",
        compat="taskflow",
    )
    assert _topic_queue(plain).auto_delete is False
    assert _topic_queue(mixed).auto_delete is True
    assert plain.server.proxy._exchange.auto_delete is False
    assert mixed.server.proxy._exchange.auto_delete is True


def test_engine_passes_compat_to_its_executor():
    executor = WorkerBasedActionEngine._fetch_task_executor(
        {
            "exchange": f"c-{uuid.uuid4().hex[:8]}",
            "transport": "memory",
            "topics": ["t"],
            "compat": "taskflow",
        },
        flow_detail=None,
    )
    assert executor._proxy._exchange.auto_delete is True
    with pytest.raises(ValueError, match="Unknown compat"):
        WorkerBasedActionEngine._fetch_task_executor(
            {"exchange": "x", "transport": "memory", "compat": "celery"}, flow_detail=None
        )


def test_warnings_are_bounded_and_once_per_peer(caplog):
    caplog.set_level("WARNING", logger=compat.LOG.name)
    for _ in range(3):
        assert compat.note_request({}, "reply-a", "w-bounded", "req")
    assert compat.note_request({}, "reply-b", "w-bounded", "req")
    assert not compat.note_request({"origin": "h:1", "attempt": 0}, "reply-c", "w-bounded", "req")
    assert len(caplog.records) == 2
    once = compat._WarnOnce(limit=2)
    assert [once.first(k) for k in ("a", "b", "a", "c", "b")] == [True, True, False, True, True]
