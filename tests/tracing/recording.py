"""Recording flowengine's spans with the OpenTelemetry SDK's in-memory exporter.

A recorder is a TracerProvider of its own handed to
:func:`flowengine.tracing.set_tracer_provider` (the process's global provider
is left alone, so tests in the same process are not traced). Spans are
turned into plain records (:func:`as_record`) so that spans exported in
another process and written to a file compare with ours.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed (pip install -e .[test])"
)

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from flowengine import tracing  # noqa: E402


def exporting_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider that hands each span to an in-memory exporter as it ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@contextlib.contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """flowengine's spans go to the yielded exporter for the duration of the block."""
    provider, exporter = exporting_provider()
    tracing.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()


def _hex(number: int | None, width: int) -> str | None:
    return None if number is None else format(number, f"0{width}x")


def as_record(span: ReadableSpan) -> dict[str, Any]:
    """What the tests compare of a finished span, as JSON-able data."""
    context = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": _hex(context.trace_id, 32),
        "span_id": _hex(context.span_id, 16),
        "parent_id": _hex(span.parent.span_id if span.parent else None, 16),
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "description": span.status.description,
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
    }


def records(spans: Iterable[ReadableSpan]) -> list[dict[str, Any]]:
    """as_record() of each span."""
    return [as_record(span) for span in spans]


def dump(spans: Iterable[ReadableSpan], path: str) -> None:
    """Write the records of ``spans`` to ``path`` as JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(records(spans), f)


def by_name(found: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Records by span name (fails if a name repeats: the tests' flows avoid that)."""
    table: dict[str, dict[str, Any]] = {}
    for record in found:
        assert record["name"] not in table, f"two spans named {record['name']!r}"
        table[record["name"]] = record
    return table
