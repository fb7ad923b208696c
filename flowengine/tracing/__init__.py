"""OpenTelemetry traces of flows (optional: ``pip install 'flowengine[otel]'``).

With ``opentelemetry-api`` installed, every engine traces its runs: a span per
flow run, a child span per atom execution or revert (:mod:`.engine_spans`),
and a worker's span for each request body it runs, a child of the engine's
atom span (:mod:`.worker_spans`). The atom span's context travels in the
request's ``traceparent``/``tracestate`` headers (W3C Trace Context), which
TaskFlow peers ignore. Spans go to the tracer provider the application
configured (``opentelemetry.trace.set_tracer_provider``, or
``opentelemetry-instrument``); without one, OpenTelemetry's no-op tracer
makes them cost next to nothing.

Without the package nothing here imports it and nothing is traced;
``FLOWENGINE_TRACING=off`` turns tracing off with the package installed.
This module itself never imports opentelemetry: :func:`enabled` tries once.
Span names and attributes are listed in doc/source/operations.rst.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ENV_SWITCH", "enabled", "request_headers", "set_tracer_provider", "tracer"]

#: Environment variable that turns tracing off when set to one of OFF_VALUES
#: (read whenever an engine or a worker topic is created).
ENV_SWITCH = "FLOWENGINE_TRACING"
OFF_VALUES = frozenset(("0", "off", "false", "no"))

#: Name (and version) of the instrumentation, as tracing backends show it.
INSTRUMENTATION_NAME = "flowengine"

# None: not tried yet; then whether opentelemetry's trace API imported.
_importable: bool | None = None

# The provider spans go to (None: OpenTelemetry's global one), and the
# tracer got from it (None: not yet). The global provider's tracer is a proxy
# that follows a provider configured later, so it is got once.
_provider: Any = None
_tracer: Any = None

#: Atom uuid -> the headers that carry its open span's context (W3C Trace
#: Context), filled by engine_spans while the span is open; the worker-based
#: executor adds them to the atom's requests. A plain dict: one writer per
#: atom at a time, readers only look up (atomic under the GIL).
CARRIERS: dict[str, dict[str, str]] = {}


def enabled() -> bool:
    """True when flowengine makes spans: opentelemetry-api importable, not switched off."""
    global _importable
    if os.environ.get(ENV_SWITCH, "").strip().lower() in OFF_VALUES:
        return False
    if _importable is None:
        try:
            import opentelemetry.propagate  # noqa: F401
            import opentelemetry.trace  # noqa: F401
        except ImportError:
            _importable = False
        else:
            _importable = True
    return _importable


def set_tracer_provider(provider: Any) -> None:
    """Send flowengine's spans to ``provider`` instead of the global provider (None: back).

    For tests and for applications that keep one provider per library;
    everyone else configures OpenTelemetry's global provider.
    """
    global _provider, _tracer
    _provider, _tracer = provider, None


def tracer() -> Any:
    """flowengine's tracer (opentelemetry.trace.Tracer); only call when enabled()."""
    global _tracer
    found = _tracer
    if found is None:
        from opentelemetry import trace

        from flowengine import __version__

        found = _tracer = trace.get_tracer(
            INSTRUMENTATION_NAME, __version__, tracer_provider=_provider
        )
    return found


def request_headers(atom_uuid: str) -> dict[str, str] | None:
    """The trace headers for a request of atom ``atom_uuid`` (None: not traced)."""
    return CARRIERS.get(atom_uuid)
