"""Worker: which tasks it exposes, its banner, and its run/wait/stop lifecycle."""

from __future__ import annotations

import contextlib
import logging
import threading
import types
from collections.abc import Iterator

import pytest
import worker_tasks as wt
from wire_helpers import Client

from flowengine import task
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.worker_side import worker as wk

SERVED = [
    "worker_tasks.Add",
    "worker_tasks.BadFailure",
    "worker_tasks.Blocking",
    "worker_tasks.Fail",
    "worker_tasks.Huge",
    "worker_tasks.NeedsArg",
    "worker_tasks.Progress",
    "worker_tasks.Unserialisable",
]


def names(endpoints):
    return sorted(ep.name for ep in endpoints)


@pytest.mark.parametrize("item", ["worker_tasks", wt], ids=["module name", "module"])
def test_module_exposes_only_task_classes_defined_there(item):
    # worker_tasks imports `task` (whose Task classes are not defined there)
    # and defines _Helper (not a task): neither is exposed.
    assert names(wk.derive_endpoints([item])) == SERVED


@pytest.mark.parametrize(
    "item", ["worker_tasks:Add", "worker_tasks.Add", wt.Add], ids=["colon", "dotted", "class"]
)
def test_single_class_items(item):
    assert names(wk.derive_endpoints([item])) == ["worker_tasks.Add"]


def test_duplicates_are_merged_in_first_seen_order():
    eps = wk.derive_endpoints([wt.Fail, "worker_tasks:Add", wt.Fail, "worker_tasks.Add"])
    assert [ep.name for ep in eps] == ["worker_tasks.Fail", "worker_tasks.Add"]


@pytest.mark.parametrize(
    "item,error,needle",
    [
        ("worker_tasks:_Helper", TypeError, "not a Task subclass"),
        ("worker_tasks.RELEASE", TypeError, "not a Task subclass"),
        (wt._Helper, TypeError, "not a Task subclass"),
        (task.Task, TypeError, "abstract"),
        (42, TypeError, "unexpected type int"),
        ("no_such_module_anywhere", ImportError, "no_such_module_anywhere"),
        ("worker_tasks.Nope", ImportError, "worker_tasks.Nope"),
    ],
)
def test_bad_items_are_refused_naming_them(item, error, needle):
    with pytest.raises(error, match=needle):
        wk.derive_endpoints([item])


def test_a_module_that_fails_to_import_is_a_real_error(tmp_path, monkeypatch):
    (tmp_path / "broken_tasks_mod.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="no_such_dependency_xyz"):
        wk.derive_endpoints(["broken_tasks_mod"])


def test_a_lone_item_is_accepted():
    assert names(wk.derive_endpoints(wt.Add)) == ["worker_tasks.Add"]
    assert names(wk.derive_endpoints("worker_tasks:Add")) == ["worker_tasks.Add"]
    module = types.ModuleType("empty_mod")
    assert wk.derive_endpoints([module]) == []


def test_threads_count_must_be_positive():
    with pytest.raises(ValueError, match="threads_count"):
        wk.Worker("ex", "t", [wt.Add], threads_count=0, transport="memory")


def test_banner_shows_what_and_where_but_no_password():
    worker = wk.Worker(
        "bank",
        "payments",
        [wt.Add, wt.Fail],
        threads_count=3,
        url="amqp://bob:hunter2@mq.invalid:5672//",
    )
    banner = worker.banner
    assert "hunter2" not in banner
    for needle in (
        "WBE worker",
        "Exchange = bank",
        "Topic = payments",
        "Transport = amqp",
        "Uri = amqp://bob:**@mq.invalid:5672//",
        "Thread count = 3",
        "- worker_tasks.Add",
        "- worker_tasks.Fail",
        "Executor = concurrent.futures.thread.ThreadPoolExecutor",
        f"Worker id = {worker.worker_id}",
    ):
        assert needle in banner, needle
    worker.stop()  # never started: stopping is harmless


def test_custom_executor_is_used_and_not_shut_down():
    from concurrent import futures

    pool = futures.ThreadPoolExecutor(1)
    worker = wk.Worker("ex", "t", [wt.Add], executor=pool, transport="memory")
    assert "Thread count" not in worker.banner
    worker.stop()
    assert pool.submit(lambda: 5).result(5) == 5  # still usable: not ours to stop
    pool.shutdown()


def test_run_serves_until_stop(unique_name, caplog):
    written = []
    worker = wk.Worker(unique_name, "t", ["worker_tasks"], threads_count=1, transport="memory")
    assert worker.topic == "t" and names(worker.endpoints) == SERVED
    thread = threading.Thread(
        target=worker.run, kwargs={"banner_writer": written.append}, daemon=True
    )
    with Client(unique_name, transport="memory") as client:
        thread.start()
        assert worker.wait(10)
        cid = client.request(wt.Add(), arguments={"x": 2, "y": 2}, routing_key="t")
        assert client.final(cid)["data"]["result"] == 4
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert written == [worker.banner]


def test_run_logs_the_banner_by_default(unique_name, caplog):
    worker = wk.Worker(unique_name, "t", [wt.Add], threads_count=1, transport="memory")
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level(logging.INFO, logger="flowengine.engines.worker_based.worker_side.worker"):
        thread.start()
        assert worker.wait(10)
        worker.stop()
        thread.join(10)
    assert "Topic = t" in caplog.text and "- worker_tasks.Add" in caplog.text


@contextlib.contextmanager
def _running_a_blocking_request(
    unique_name: str,
) -> Iterator[tuple[wk.Worker, Client, str, threading.Thread]]:
    """A memory-transport worker serving in a thread, running one Blocking request.

    Yields (worker, client, request correlation id, the worker's thread) once
    the body started; the body ends when wt.RELEASE is set (at the latest on
    leaving).
    """
    wt.STARTED.clear()
    wt.RELEASE.clear()
    worker = wk.Worker(unique_name, "t", [wt.Blocking], threads_count=1, transport="memory")
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    try:
        with Client(unique_name, transport="memory") as client:
            thread.start()
            assert worker.wait(10)
            cid = client.request(wt.Blocking(), routing_key="t")
            assert wt.STARTED.wait(10)
            yield worker, client, cid, thread
    finally:
        wt.RELEASE.set()


def test_stop_finishes_running_requests_first(unique_name):
    with _running_a_blocking_request(unique_name) as (worker, client, cid, thread):
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        assert client.wait_for(lambda: any(h.get(pr.HEADER_LEAVING) for _d, h in client.notifies))
        wt.RELEASE.set()  # the running task finishes and still answers
        stopper.join(10)
        thread.join(10)
        assert client.final(cid)["state"] == "SUCCESS"
    assert not thread.is_alive() and not stopper.is_alive()


def test_waiting_until_outcomes_are_sent_ends_once_the_running_request_answered(unique_name):
    with _running_a_blocking_request(unique_name) as (worker, client, cid, thread):
        try:
            keys = {key for key, _reply_to, _started in worker.running_requests()}
            assert len(keys) == 1
            # While it runs, its outcome is not sent: a wait that may not wait says so.
            assert worker.wait_until_sent(keys, 0.0) == keys
            wt.RELEASE.set()
            assert worker.wait_until_sent(keys, 10) == set()
            assert client.final(cid)["state"] == "SUCCESS"
        finally:
            wt.RELEASE.set()
            worker.stop()
            thread.join(10)


WORKER_SCRIPT = """
import signal, sys, threading
sys.path.insert(0, sys.argv[3])
from flowengine.engines.worker_based.worker_side import worker
w = worker.Worker(sys.argv[1], "t", ["worker_tasks"], threads_count=2,
                  transport="filesystem", transport_options={"data_folder": sys.argv[2]})
signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=w.stop).start())
w.run(display_banner=False)
"""


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_worker_in_another_process_over_the_filesystem(tmp_path, unique_name):
    import os
    import subprocess
    import sys

    options = {"data_folder": str(tmp_path)}
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [
                os.path.dirname(
                    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                )
            ]
            + [p for p in [os.environ.get("PYTHONPATH")] if p]
        ),
    )
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # worker_tasks.py
    with Client(unique_name, transport="filesystem", transport_options=options) as client:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_SCRIPT, unique_name, str(tmp_path), here], env=env
        )
        try:
            # The worker announces itself as soon as it consumes: no polling.
            assert client.wait_for(
                lambda: any(h.get(pr.HEADER_WORKER_ID) for _d, h in client.notifies), timeout=30
            )
            cids = [
                client.request(wt.Add(), arguments={"x": i, "y": i}, routing_key="t")
                for i in range(50)
            ]
            assert [client.final(c)["data"]["result"] for c in cids] == [2 * i for i in range(50)]
            assert all(client.states(c) == ["RUNNING", "SUCCESS"] for c in cids)
            proc.terminate()
            assert proc.wait(30) == 0
            assert client.wait_for(
                lambda: any(h.get(pr.HEADER_LEAVING) for _d, h in client.notifies)
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
