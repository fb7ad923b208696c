"""``flowengine worker`` in a process whose OpenTelemetry SDK exports to memory.

Usage: ``python -m tests.tracing.traced_worker SPANS_FILE WORKER_ARGS...``.
The global tracer provider is configured the way an application (or
``opentelemetry-instrument``) would, before the worker starts; when the
worker stops (SIGTERM: warm shutdown), the spans it finished are written to
SPANS_FILE as JSON records (tests/tracing/recording.py) at interpreter exit.
"""

from __future__ import annotations

import atexit
import sys

from opentelemetry import trace

from flowengine import cli
from tests.tracing import recording


def main(argv: list[str]) -> int:
    spans_file, worker_args = argv[0], argv[1:]
    provider, exporter = recording.exporting_provider()
    trace.set_tracer_provider(provider)
    atexit.register(lambda: recording.dump(exporter.get_finished_spans(), spans_file))
    return cli.main(["worker", *worker_args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
