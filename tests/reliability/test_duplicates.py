"""The same request delivered several times (raw publish): its body runs once.

Given a worker process, when one request (same uuid, action, submission id
and attempt) is published five times — three while it runs, two after it
finished — then the task body ran once, the duplicates that came while it
ran were answered with its state and the later ones with its remembered
outcome.
"""

from __future__ import annotations

import os
import uuid

import pytest

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import liveness as lv
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import Workers
from tests.worker_based.wire_helpers import Client

#: Bounded wait (s) for replies, only to fail instead of hanging.
WAIT_S = 30.0

#: The worker's heartbeat interval (s): longer than the test, so each RUNNING
#: the client hears answers a delivery. A heartbeat repeats RUNNING too, and at
#: the fault tests' 0.2 s one could stand in for a duplicate's answer: the
#: body was then released before that duplicate was taken, which the worker
#: rightly answered with the outcome (a fourth SUCCESS; seen under -n 2).
HEARTBEAT_S = 2 * WAIT_S


@pytest.mark.slow
def test_duplicate_deliveries_run_the_body_once(conn, tmp_path, unique_name):
    records = str(tmp_path / "records.jsonl")
    fifo = str(tmp_path / "release.fifo")
    os.mkfifo(fifo)
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(
        conn, unique_name, "dups", records, str(logs), threads=2, heartbeat_s=HEARTBEAT_S
    )
    with Client(unique_name, **conn.kwargs()) as client:
        try:
            # Given a worker process
            workers.start()
            assert client.wait_for(lambda: client.notifies, WAIT_S), workers.logs()
            cid = uuid.uuid4().hex
            request = pr.Request(fault_tasks.Blocker("b"), cid, pr.EXECUTE, {"fifo": fifo})
            headers = {pr.HEADER_ATTEMPT: 0, lv.HEADER_REQUEST_ID: "submission-1"}

            def deliver() -> None:
                client.proxy.publish(
                    request, "dups", reply_to=client.uuid, correlation_id=cid, headers=headers
                )

            # When it is delivered three times while it runs...
            deliver()
            assert client.wait_for(lambda: pr.RUNNING in client.states(cid), WAIT_S)
            deliver()
            deliver()
            # (PENDING + RUNNING of the first, one RUNNING per duplicate)
            assert client.wait_for(lambda: len(client.states(cid)) >= 4, WAIT_S), client.states(cid)
            assert client.states(cid) == [pr.PENDING] + [pr.RUNNING] * 3, client.states(cid)
            with open(fifo, "w") as f:  # let the body finish
                f.write("done\n")
            assert client.final(cid, WAIT_S)["data"]["result"] == "done"
            # ...and twice after it finished
            deliver()
            deliver()
            assert client.wait_for(lambda: client.states(cid).count(pr.SUCCESS) == 3, WAIT_S), (
                client.states(cid)
            )
        finally:
            workers.stop_all()
    # Then the body ran exactly once
    report = checker.check(checker.read_records(records), ["b"])
    assert report.done_once == ["b"], report.summary()
    assert len(report.executions["b"]) == 1
    states = client.states(cid)
    assert states.count(pr.SUCCESS) == 3 and pr.FAILURE not in states, states
