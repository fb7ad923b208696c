"""A worker's spans join the engine's trace across real processes.

The engine runs in this process, a ``flowengine worker`` in a subprocess
(filesystem transport: no server to start); each exports its spans to
memory with the OpenTelemetry SDK, and the worker writes its spans to a
file when it stops. The two sets must make one trace: each worker span a
child of the engine's span for the same atom and action.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed (pip install -e .[test])"
)

from flowengine import engines  # noqa: E402
from flowengine.patterns import linear_flow  # noqa: E402
from tests.ops import helpers  # noqa: E402
from tests.proc_utils import stop_processes  # noqa: E402
from tests.tracing import recording  # noqa: E402
from tests.tracing import traced_tasks as tt  # noqa: E402

#: Seconds the worker gets to stop (warm) and write its spans.
STOP_S = 20.0


@pytest.fixture
def traced_worker(tmp_path):
    """A traced `flowengine worker` on a filesystem transport; yields (options, spans file)."""
    exchange = f"traced-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "broker"
    folder.mkdir()
    spans_file = tmp_path / "worker-spans.json"
    cmd = [
        sys.executable,
        "-m",
        "tests.tracing.traced_worker",
        str(spans_file),
        "--exchange",
        exchange,
        "--topic",
        "shop",
        "--tasks",
        "tests.tracing.traced_tasks",
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={folder}",
        "--threads",
        "2",
    ]
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=helpers.env(), cwd=helpers.ROOT
    )
    options = {
        "engine": "worker-based",
        "exchange": exchange,
        "topics": ["shop"],
        "transport": "filesystem",
        "transport_options": {"data_folder": str(folder)},
    }
    try:
        yield proc, options, spans_file
    finally:
        stop_processes([proc], STOP_S)
        log.close()


def test_worker_spans_are_children_of_the_engines_atom_spans(traced_worker):
    proc, options, spans_file = traced_worker
    # Given a flow whose second task fails on a worker in another process
    flow = linear_flow.Flow("order").add(tt.Charge("charge"), tt.Ship("ship"))
    with recording.recording() as exporter:
        # When the engine here runs it (the engine waits for the worker to show up)
        with pytest.raises(Exception, match=tt.NO_TRUCK):
            engines.run(flow, store={"card_number": tt.SECRET_CARD}, **options)
    # ... and the worker stops and hands back its spans
    stop_processes([proc], STOP_S)
    assert proc.returncode == 0
    ours = recording.by_name(recording.records(exporter.get_finished_spans()))
    theirs = recording.by_name(json.loads(spans_file.read_text()))
    # Then the worker made a span for each request body it ran
    assert set(theirs) == {
        "worker execute Charge",
        "worker execute Ship",
        "worker revert Ship",
        "worker revert Charge",
    }
    # ... each in the engine's one trace, a child of the engine's span for that atom
    trace_id = ours["flow order"]["trace_id"]
    for name, span in theirs.items():
        parent = ours[name.removeprefix("worker ")]
        assert span["trace_id"] == trace_id, name
        assert span["parent_id"] == parent["span_id"], name
        assert parent["parent_id"] == ours["flow order"]["span_id"], name
        assert span["kind"] == "CONSUMER"
        assert (
            span["attributes"]["flowengine.atom.uuid"]
            == (parent["attributes"]["flowengine.atom.uuid"])
        )
        assert span["attributes"]["flowengine.request.attempt"] == 0
        assert span["attributes"]["flowengine.worker.topic"] == "shop"
        assert (
            span["attributes"]["flowengine.flow.uuid"]
            == (ours["flow order"]["attributes"]["flowengine.flow.uuid"])
        )
    # ... the engine's execute spans name the worker that ran them
    worker_id = theirs["worker execute Charge"]["attributes"]["flowengine.worker.id"]
    assert str(proc.pid) in worker_id
    assert ours["execute Charge"]["attributes"]["flowengine.worker.id"] == worker_id
    assert ours["execute Charge"]["attributes"]["flowengine.request.dispatches"] == 1
    # ... the failure is recorded on both sides, the task's arguments on neither
    failed = theirs["worker execute Ship"]
    assert failed["status"] == "ERROR"
    assert failed["attributes"]["flowengine.outcome"] == "FAILURE"
    assert [e["attributes"]["exception.message"] for e in failed["events"]] == [tt.NO_TRUCK]
    assert ours["execute Ship"]["status"] == "ERROR"
    assert theirs["worker revert Charge"]["attributes"]["flowengine.outcome"] == "SUCCESS"
    everything = json.dumps([ours, theirs])
    assert tt.SECRET_CARD not in everything
