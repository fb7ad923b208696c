#!/usr/bin/env python3
"""Cost of OpenTelemetry tracing: a 100-task linear flow on the memory transport.

An in-process worker per mode serves a linear flow of ``TASKS`` trivial tasks
on the worker-based engine; the flow runs ``RUNS`` times in each mode, the
modes taking turns, each round starting with the next mode (so a change in
machine load hits all alike):

- ``off``   flowengine does not trace (``FLOWENGINE_TRACING=off`` when the
            engine and the worker are made: the code path of a process
            without the ``otel`` extra)
- ``noop``  opentelemetry-api installed, no tracer provider configured
            (OpenTelemetry's no-op tracer): the cost users pay by default
- ``sdk``   the SDK recording every span to memory (``--sdk``; needs
            opentelemetry-sdk): what recording traces costs

The median wall time and CPU time (of this process: engine and worker
together) per flow of each mode are printed with their ratio to ``off``; on
a machine shared with other work the CPU figure is the steadier one.
Usage::

    python tools/bench/bench_tracing.py [--runs N] [--tasks N] [--sdk] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flowengine import engines, task, tracing  # noqa: E402
from flowengine.engines.worker_based.worker_side import worker as wk  # noqa: E402
from flowengine.patterns import linear_flow  # noqa: E402

#: Tasks in the flow (the issue's figure).
TASKS = 100

#: Timed runs per mode (after one warm-up round): the median is reported.
RUNS = 9

#: Seconds any wait may take before the benchmark gives up.
WAIT_S = 30.0


class Step(task.Task):
    """A trivial task: returns its input plus one."""

    def execute(self, value: int) -> int:
        return value + 1


def make_flow(tasks: int) -> Any:
    """``tasks`` steps chained through the symbols v0 -> v1 -> ... -> vN."""
    flow = linear_flow.Flow("bench-tracing")
    for i in range(tasks):
        flow.add(Step(f"step-{i}", rebind={"value": f"v{i}"}, provides=f"v{i + 1}"))
    return flow


@contextlib.contextmanager
def mode(name: str, provider: Any) -> Iterator[None]:
    """What flowengine sees while engines and workers of mode ``name`` are made."""
    saved = os.environ.get(tracing.ENV_SWITCH)
    if name == "off":
        os.environ[tracing.ENV_SWITCH] = "off"
    tracing.set_tracer_provider(provider if name == "sdk" else None)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(tracing.ENV_SWITCH, None)
        else:
            os.environ[tracing.ENV_SWITCH] = saved
        tracing.set_tracer_provider(None)


@contextlib.contextmanager
def serving(exchange: str, name: str, provider: Any) -> Iterator[None]:
    pool = futures.ThreadPoolExecutor(max_workers=2)
    with mode(name, provider):
        worker = wk.Worker(exchange, "bench", [Step], executor=pool, transport="memory")
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    if not worker.wait(WAIT_S):
        raise RuntimeError("worker did not start")
    try:
        yield
    finally:
        worker.stop()
        pool.shutdown()
        thread.join(WAIT_S)


def sdk_provider() -> tuple[Any, Any]:
    """A provider recording to memory, and its exporter (spans dropped each run)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def flow_ms(modes: list[str], tasks: int, runs: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU time (ms) of one flow run in each mode; runs interleave."""
    provider, exporter = sdk_provider() if "sdk" in modes else (None, None)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    spans: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        exchanges = {}
        for name in modes:
            exchange = exchanges[name] = f"bench-{uuid.uuid4().hex[:8]}"
            stack.enter_context(serving(exchange, name, provider))
        for i in range(runs + 1):
            # Each round starts with another mode: whichever runs first after
            # the others' runs must not always be the same one.
            for name in modes[i % len(modes) :] + modes[: i % len(modes)]:
                with mode(name, provider):
                    engine = engines.load(
                        make_flow(tasks),
                        store={"v0": 0},
                        engine="worker-based",
                        exchange=exchanges[name],
                        topics=["bench"],
                        transport="memory",
                    )
                    started, cpu_started = time.perf_counter(), time.process_time()
                    engine.run()
                    elapsed = time.perf_counter() - started
                    cpu = time.process_time() - cpu_started
                assert engine.storage.fetch(f"v{tasks}") == tasks
                if exporter is not None and name == "sdk":
                    spans["sdk"] = len(exporter.get_finished_spans())
                    exporter.clear()
                if i:  # the first round warms up connections and caches
                    samples[name].append((elapsed * 1000.0, cpu * 1000.0))
    if spans:
        print(f"sdk: {spans['sdk']} spans per flow", file=sys.stderr)
    return {
        name: {
            "wall_ms": statistics.median(wall for wall, _ in values),
            "cpu_ms": statistics.median(cpu for _, cpu in values),
        }
        for name, values in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--tasks", type=int, default=TASKS)
    parser.add_argument("--sdk", action="store_true", help="also time recording spans")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not tracing.enabled():
        print("opentelemetry-api is not installed: pip install -e '.[otel]'", file=sys.stderr)
        return 2
    modes = ["off", "noop", *(["sdk"] if args.sdk else [])]
    row = flow_ms(modes, args.tasks, args.runs)
    for figure in ("wall_ms", "cpu_ms"):
        base = row["off"][figure]
        print(
            f"{figure[:-3]:<4} "
            + "  ".join(
                f"{name} {row[name][figure]:7.1f} ms/flow ({row[name][figure] / base:.3f}x)"
                for name in modes
            ),
            flush=True,
        )
    if args.json:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
