"""An engine's spans: one per flow run, a child per atom execution or revert.

Made from the engine's own notifications (the ones listeners and metrics
hear): the flow's RUNNING opens the flow span (a child of whatever span is
current where ``run()`` is called, else the root of a new trace), an atom's
RUNNING or REVERTING opens its span, its next state closes it with that
state as the outcome. While an atom's span is open its context waits in
:data:`flowengine.tracing.CARRIERS` for the worker-based executor to put in
the atom's requests, so the worker's span joins this trace.

The atom notifier is listened to only while a traced run goes on: when
the flow span records nothing and carries no trace (no tracer provider
configured, no trace around the caller), the run's atoms cost nothing.
"""

from __future__ import annotations

import threading
from typing import Any

from flowengine import states, tracing
from flowengine.tracing import spans
from flowengine.types import failure as ft
from flowengine.types.notifier import Notifier
from flowengine.utils import optional, reflection

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Status, StatusCode
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise optional.missing_extra("otel", e) from e

#: Flow states that end a run, and those of them that mean it failed.
_FLOW_ENDS = frozenset((states.SUCCESS, states.FAILURE, states.REVERTED, states.SUSPENDED))
_FLOW_FAILED = frozenset((states.FAILURE, states.REVERTED))

#: Atom states that open a span, with the action the span is named after.
_ATOM_STARTS = {states.RUNNING: "execute", states.REVERTING: "revert"}

#: Atom states that close an open span (the outcome), and the failed ones.
_ATOM_ENDS = frozenset(
    (
        states.SUCCESS,
        states.FAILURE,
        states.REVERTED,
        states.REVERT_FAILURE,
        states.PENDING,
        states.IGNORE,
        states.RETRYING,
    )
)
_ATOM_FAILED = frozenset((states.FAILURE, states.REVERT_FAILURE))

#: Outcome of atom spans still open when their flow's run ended.
UNFINISHED = "UNFINISHED"


def watch(engine: Any) -> FlowSpans:
    """Trace ``engine``'s runs (registers on its flow notifier); the tracer object."""
    flow_spans = FlowSpans(engine)
    engine.notifier.register(Notifier.ANY, flow_spans.on_flow)
    return flow_spans


class FlowSpans:
    """The spans of one engine's runs (see the module docstring)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._flow: Span | None = None
        self._flow_context: Context | None = None
        self._flow_attributes: dict[str, str] = {}
        # Atom uuid -> its open span and the span's action (an execute and
        # its revert share a uuid, one after the other).
        self._atoms: dict[str, tuple[Span, str]] = {}
        # Atom name -> executions started in this run (a retry runs it again).
        self._executions: dict[str, int] = {}
        self._classes: dict[str, str] = {}

    # -- the flow ----------------------------------------------------------------

    def on_flow(self, state: str, details: dict[str, Any]) -> None:
        """The engine's flow notifier: RUNNING opens the run's span, an end closes it."""
        if state == states.RUNNING:
            self._start_flow(details)
        elif state in _FLOW_ENDS:
            self._end_flow(state)

    def _start_flow(self, details: dict[str, Any]) -> None:
        self._end_flow(UNFINISHED)  # a run that never told its end
        attributes = {
            spans.FLOW_NAME: str(details.get("flow_name")),
            spans.FLOW_UUID: str(details.get("flow_uuid")),
        }
        span = tracing.tracer().start_span(
            f"flow {details.get('flow_name')}",
            attributes={**attributes, spans.ENGINE: type(self._engine).__name__},
        )
        if not span.is_recording() and not span.get_span_context().is_valid:
            return
        with self._lock:
            self._flow = span
            self._flow_context = trace.set_span_in_context(span)
            self._flow_attributes = attributes
            self._executions = {}
        atoms = self._engine.atom_notifier
        if not atoms.is_registered(Notifier.ANY, self.on_atom):
            atoms.register(Notifier.ANY, self.on_atom)

    def _end_flow(self, state: str) -> None:
        with self._lock:
            flow, self._flow = self._flow, None
            atoms, self._atoms = self._atoms, {}
        for uuid, (span, _action) in atoms.items():
            tracing.CARRIERS.pop(uuid, None)
            span.set_attribute(spans.OUTCOME, UNFINISHED)
            span.end()
        if flow is None:
            return
        atoms_notifier = self._engine.atom_notifier
        if atoms_notifier.is_registered(Notifier.ANY, self.on_atom):
            atoms_notifier.deregister(Notifier.ANY, self.on_atom)
        flow.set_attribute(spans.OUTCOME, state)
        if state in _FLOW_FAILED:
            flow.set_status(Status(StatusCode.ERROR, f"the flow ended {state}"))
        flow.end()

    # -- its atoms -----------------------------------------------------------------

    def on_atom(self, state: str, details: dict[str, Any]) -> None:
        """The engine's atom notifier: open or close the atom's span."""
        if self._flow is None:
            return
        action = _ATOM_STARTS.get(state)
        if action is None and state not in _ATOM_ENDS:
            return  # progress, or a state that neither starts nor ends work
        name = details.get("task_name") or details.get("retry_name")
        uuid = details.get("task_uuid") or details.get("retry_uuid")
        if name is None or uuid is None:
            return
        self._end_atom(uuid, name, state, details.get("result"))
        if action is not None:
            self._start_atom(uuid, name, action)

    def _start_atom(self, uuid: str, name: str, action: str) -> None:
        with self._lock:
            context = self._flow_context
            if context is None:
                return
            execution = self._executions.get(name, 0) + (action == "execute")
            self._executions[name] = execution
        task_class = self._class_of(name)
        span = tracing.tracer().start_span(
            f"{action} {spans.short_class(task_class)}",
            context=context,
            attributes={
                **self._flow_attributes,
                spans.ATOM_NAME: name,
                spans.ATOM_UUID: uuid,
                spans.TASK_CLASS: task_class,
                spans.ACTION: action,
                spans.ATOM_EXECUTION: max(execution, 1),
            },
        )
        carrier: dict[str, str] = {}
        spans.PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        with self._lock:
            self._atoms[uuid] = (span, action)
        if carrier:
            tracing.CARRIERS[uuid] = carrier

    def _end_atom(self, uuid: str, name: str, state: str, result: Any) -> None:
        with self._lock:
            opened = self._atoms.pop(uuid, None)
        if opened is None:
            return
        span, action = opened
        tracing.CARRIERS.pop(uuid, None)
        span.set_attribute(spans.OUTCOME, state)
        if state in _ATOM_FAILED and isinstance(result, ft.Failure):
            spans.record_failure(span, result)
        if action == "execute":  # remote statistics describe executions only
            self._note_remote(span, name)
        span.end()

    def _note_remote(self, span: Span, name: str) -> None:
        """Which worker ran the atom's last request and how often it was sent (remote only)."""
        executor = getattr(self._engine, "_task_executor", None)
        remote = getattr(executor, "remote_statistics", None)
        entry = remote.of(name) if remote is not None and hasattr(remote, "of") else None
        if not entry:
            return
        if entry.get("worker_id"):
            span.set_attribute(spans.WORKER_ID, str(entry["worker_id"]))
        if entry.get("dispatches"):
            span.set_attribute(spans.DISPATCHES, int(entry["dispatches"]))

    def _class_of(self, atom_name: str) -> str:
        """The dotted class of the atom named ``atom_name``, looked up once per name."""
        found = self._classes.get(atom_name)
        if found is None:
            compilation = getattr(self._engine, "compilation", None)
            atom = compilation.atoms.get(atom_name) if compilation is not None else None
            found = reflection.get_class_name(atom) if atom is not None else atom_name
            self._classes[atom_name] = found
        return found
