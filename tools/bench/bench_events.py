#!/usr/bin/env python3
"""Cost of the event stream: per-task latency of a 50-task linear flow, events off vs on.

For each transport (memory, filesystem, redis when redis-server is installed)
an in-process worker per mode serves a linear flow of ``TASKS`` trivial tasks
on the worker-based engine; the flow runs ``RUNS`` times in each of three
modes, the modes taking turns (so a change in machine load hits all alike):

- ``off``       events disabled (worker and engine)
- ``on``        events enabled, nobody listening
- ``on+view``   events enabled and one EventReceiver consuming them

and the median per-task latency (run time / tasks) of each mode is printed
with its ratio to ``off``.  Usage::

    python tools/bench/bench_events.py [--runs N] [--transport memory ...] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flowengine import engines, task  # noqa: E402
from flowengine.engines.worker_based import events as ev  # noqa: E402
from flowengine.engines.worker_based.worker_side import worker as wk  # noqa: E402
from flowengine.patterns import linear_flow  # noqa: E402

#: Tasks in the flow (the issue's figure).
TASKS = 50

#: Timed runs per mode (after one warm-up run): the median is reported.
RUNS = 7

#: Seconds any wait may take before the benchmark gives up.
WAIT_S = 30.0


class Step(task.Task):
    """A trivial task: returns its input plus one."""

    def execute(self, value: int) -> int:
        return value + 1


def make_flow() -> Any:
    """``TASKS`` steps chained through the symbols v0 -> v1 -> ... -> vN."""
    flow = linear_flow.Flow("bench-events")
    for i in range(TASKS):
        flow.add(Step(f"step-{i}", rebind={"value": f"v{i}"}, provides=f"v{i + 1}"))
    return flow


@contextlib.contextmanager
def serving(exchange: str, conn: dict[str, Any], events: bool) -> Iterator[None]:
    pool = futures.ThreadPoolExecutor(max_workers=2)
    worker = wk.Worker(exchange, "bench", [Step], executor=pool, events=events, **conn)
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


@contextlib.contextmanager
def viewing(exchange: str, conn: dict[str, Any], enabled: bool) -> Iterator[list]:
    seen: list = []
    if not enabled:
        yield seen
        return
    receiver = ev.EventReceiver(exchange, seen.append, **conn)
    thread = threading.Thread(target=receiver.run, daemon=True)
    thread.start()
    if not receiver.wait_ready(WAIT_S):
        raise RuntimeError("receiver did not start")
    try:
        yield seen
    finally:
        receiver.stop()
        thread.join(WAIT_S)


MODES = ("off", "on", "on+view")


def per_task_ms(conn: dict[str, Any], runs: int) -> dict[str, float]:
    """Median per-task latency (ms) of each mode; runs interleave so load drifts evenly."""
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    with contextlib.ExitStack() as stack:
        exchanges = {}
        for mode in MODES:
            exchange = exchanges[mode] = f"bench-{uuid.uuid4().hex[:8]}"
            stack.enter_context(viewing(exchange, conn, mode == "on+view"))
            stack.enter_context(serving(exchange, conn, mode != "off"))
        for i in range(runs + 1):
            for mode in MODES:
                engine = engines.load(
                    make_flow(),
                    store={"v0": 0},
                    engine="worker-based",
                    exchange=exchanges[mode],
                    topics=["bench"],
                    events=mode != "off",
                    **conn,
                )
                started = time.perf_counter()
                engine.run()
                elapsed = time.perf_counter() - started
                assert engine.storage.fetch(f"v{TASKS}") == TASKS
                if i:  # the first round warms up connections and caches
                    samples[mode].append(elapsed / TASKS * 1000.0)
    return {mode: statistics.median(values) for mode, values in samples.items()}


def transports(names: list[str], stack: contextlib.ExitStack) -> Iterator[tuple[str, dict]]:
    for name in names:
        if name == "memory":
            yield name, {"transport": "memory"}
        elif name == "filesystem":
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            yield name, {"transport": "filesystem", "transport_options": {"data_folder": folder}}
        elif name == "redis":
            from tests import brokers

            if brokers.redis_binary() is None:
                print("redis: skipped (no redis-server)", file=sys.stderr)
                continue
            broker = stack.enter_context(brokers.running_redis())
            yield name, {"url": broker.url}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--transport", action="append", choices=["memory", "filesystem", "redis"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        for name, conn in transports(args.transport or ["memory", "filesystem", "redis"], stack):
            row = per_task_ms(conn, args.runs)
            results[name] = row
            print(
                f"{name:<11} off {row['off']:7.3f} ms/task   on {row['on']:7.3f}"
                f" ({row['on'] / row['off']:.2f}x)   on+view {row['on+view']:7.3f}"
                f" ({row['on+view'] / row['off']:.2f}x)",
                flush=True,
            )
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
