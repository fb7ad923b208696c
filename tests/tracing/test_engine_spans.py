"""The engine's spans on the local engines: one trace per flow, a span per atom.

Recorded with the SDK's in-memory exporter in this process (the worker's
side and real processes: test_across_processes.py).
"""

from __future__ import annotations

import itertools
import json

import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed (pip install -e .[test])"
)

from opentelemetry import trace  # noqa: E402

from flowengine import engines, retry, task, tracing  # noqa: E402
from flowengine.patterns import linear_flow  # noqa: E402
from tests.tracing import recording  # noqa: E402
from tests.tracing import traced_tasks as tt  # noqa: E402


def order_flow() -> linear_flow.Flow:
    return linear_flow.Flow("order").add(tt.Charge("charge"), tt.Ship("ship"))


@pytest.mark.parametrize("engine", ["serial", "parallel"])
def test_a_failed_flow_is_one_trace_with_a_span_per_atom_execution_and_revert(engine):
    # Given a flow whose second task fails, and a recording tracer provider
    with recording.recording() as exporter:
        # When it runs (and reverts)
        with pytest.raises(RuntimeError, match=tt.NO_TRUCK):
            engines.run(order_flow(), store={"card_number": tt.SECRET_CARD}, engine=engine)
    spans = recording.by_name(recording.records(exporter.get_finished_spans()))
    # Then one flow span is the root, every atom span its child, one trace
    assert set(spans) == {
        "flow order",
        "execute Charge",
        "execute Ship",
        "revert Ship",
        "revert Charge",
    }
    flow = spans["flow order"]
    assert flow["parent_id"] is None
    assert {s["trace_id"] for s in spans.values()} == {flow["trace_id"]}
    assert all(s["parent_id"] == flow["span_id"] for n, s in spans.items() if n != "flow order")
    # ... the flow span says how it ended, and that it failed
    assert flow["attributes"]["flowengine.outcome"] == "REVERTED"
    assert flow["attributes"]["flowengine.flow.name"] == "order"
    assert flow["status"] == "ERROR"
    # ... each atom span names the atom, its class, its action and outcome
    charge = spans["execute Charge"]["attributes"]
    assert charge["flowengine.atom.name"] == "charge"
    assert charge["flowengine.task.class"] == "tests.tracing.traced_tasks.Charge"
    assert charge["flowengine.action"] == "execute"
    assert charge["flowengine.outcome"] == "SUCCESS"
    assert charge["flowengine.flow.uuid"] == flow["attributes"]["flowengine.flow.uuid"]
    assert spans["revert Charge"]["attributes"]["flowengine.outcome"] == "REVERTED"
    # ... the failure is on the failed atom's span: status ERROR and an exception event
    ship = spans["execute Ship"]
    assert ship["status"] == "ERROR"
    assert ship["attributes"]["flowengine.outcome"] == "FAILURE"
    [event] = ship["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "RuntimeError"
    assert event["attributes"]["exception.message"] == tt.NO_TRUCK
    assert "raise RuntimeError(NO_TRUCK)" in event["attributes"]["exception.stacktrace"]
    # ... and the task's (secret) arguments are in no span
    assert tt.SECRET_CARD not in json.dumps(list(spans.values()))


def test_the_flow_span_joins_the_callers_trace():
    # Given a caller that runs a flow inside a span of its own
    with recording.recording() as exporter:
        caller = tracing.tracer()
        with caller.start_as_current_span("checkout") as outer:
            engines.run(linear_flow.Flow("packing").add(tt.Pack("pack")))
    spans = recording.by_name(recording.records(exporter.get_finished_spans()))
    # Then the flow's trace is the caller's: its span is a child of the caller's
    ids = outer.get_span_context()
    assert spans["flow packing"]["trace_id"] == format(ids.trace_id, "032x")
    assert spans["flow packing"]["parent_id"] == format(ids.span_id, "016x")
    assert spans["execute Pack"]["parent_id"] == spans["flow packing"]["span_id"]


class FailsOnce(task.Task):
    """Fails its first execution in the process, then succeeds."""

    _calls = itertools.count()

    def execute(self) -> str:
        if next(self._calls) == 0:
            raise ValueError("first try fails")
        return "ok"


def test_each_execution_a_retry_controller_makes_has_its_span_and_number():
    # Given a task under a retry controller, failing its first execution
    flow = linear_flow.Flow("retried", retry=retry.Times(2, name="twice")).add(FailsOnce("flaky"))
    with recording.recording() as exporter:
        engines.run(flow)
    found = recording.records(exporter.get_finished_spans())
    # Then there are two execute spans for it, numbered, the first failed
    runs = sorted(
        (s for s in found if s["name"] == "execute FailsOnce"),
        key=lambda s: s["attributes"]["flowengine.atom.execution"],
    )
    assert [
        (r["attributes"]["flowengine.atom.execution"], r["attributes"]["flowengine.outcome"])
        for r in runs
    ] == [(1, "FAILURE"), (2, "SUCCESS")]
    assert runs[0]["status"] == "ERROR"
    # ... and the retry controller's own executions are spans too
    assert [
        s["attributes"]["flowengine.atom.name"] for s in found if s["name"] == "execute Times"
    ] == ["twice", "twice"]


class CountingTracer:
    """Wraps flowengine's tracer and counts the spans started (a spy)."""

    def __init__(self, real):
        self.real = real
        self.started: list[str] = []

    def start_span(self, name, *args, **kwargs):
        self.started.append(name)
        return self.real.start_span(name, *args, **kwargs)


def test_without_a_tracer_provider_atoms_are_not_traced_at_all(monkeypatch):
    # Given OpenTelemetry installed but no tracer provider configured
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    spy = CountingTracer(tracing.tracer())
    monkeypatch.setattr(tracing, "tracer", lambda: spy)
    # When a three-task flow runs
    flow = linear_flow.Flow("untraced").add(tt.Pack("a"), tt.Pack("b"), tt.Pack("c"))
    engines.run(flow)
    # Then only the flow's (no-op) span was started: its atoms cost no span
    assert spy.started == ["flow untraced"]
    assert tracing.CARRIERS == {}
