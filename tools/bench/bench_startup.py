#!/usr/bin/env python3
"""Where a one-task worker-based ``run()`` spends its time: start, task, stop.

A fresh engine's ``run()`` of a 1-task flow opens the executor's connections
(its reply consumer and its publisher), sends the request, waits for the
outcome, then closes them. bench_remote.py reports the whole; this diagnostic
splits it, over ``--runs`` fresh engines one after another (workers already
up, as in bench_remote.py: processes, or threads of this process for
``memory``)::

    python tools/bench/bench_startup.py --transport redis --transport amqp

Columns (median [min-max] per ``run()``, ms): ``run()`` whole; ``start``
the executor's start, and ``consumer up`` the part of it spent waiting for
the reply consumer to connect, declare and consume (round trips to the
broker, on a fresh connection); ``task`` everything between start and stop
(compile, schedule, the request's round trip); ``stop`` the executor's stop
(the consumer's wake-up, its connection closed, its thread joined). A
diagnostic, not a benchmark: compare two trees with bench_remote.py's
``--baseline`` (interleaved runs).
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import bench_remote as br

# This tree's flowengine (as bench_remote.py's cases get), not an installed one.
sys.path.insert(0, br.REPO_ROOT)

#: Fresh engines measured per transport (after WARM_UP_RUNS unmeasured ones).
RUNS = 30
WARM_UP_RUNS = 3

#: The columns, in order, with the phase each shows.
COLUMNS = (
    ("run()", "run"),
    ("start", "start"),
    ("consumer up", "consumer"),
    ("task", "task"),
    ("stop", "stop"),
)

#: Phase -> milliseconds so far in the run being measured.
_CURRENT: dict[str, float] = collections.defaultdict(float)


def _timed(cls: Any, name: str, phase: str) -> None:
    """Add the wall time of each ``cls.name`` call to ``phase`` of the current run."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _CURRENT[phase] += (time.perf_counter() - started) * 1000.0

    setattr(cls, name, timed)


def instrument() -> None:
    """Time the executor's start and stop, and the wait for its consumer."""
    from flowengine.engines.worker_based.executor_side import executor
    from flowengine.engines.worker_based.messaging import proxy

    _timed(executor.WorkerTaskExecutor, "start", "start")
    _timed(executor.WorkerTaskExecutor, "stop", "stop")
    _timed(proxy.Proxy, "wait_started", "consumer")


def one_run(exchange: str, conn: dict[str, Any]) -> dict[str, float]:
    """A fresh engine's run() of a 1-task flow; each phase's milliseconds."""
    import bench_remote_tasks

    from flowengine import engines
    from flowengine.patterns import linear_flow

    flow = linear_flow.Flow("one").add(bench_remote_tasks.Noop("t0"))
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[br.TOPIC], **conn)
    _CURRENT.clear()
    started = time.perf_counter()
    engine.run()
    phases = dict(_CURRENT)
    phases["run"] = (time.perf_counter() - started) * 1000.0
    phases["task"] = phases["run"] - phases.get("start", 0.0) - phases.get("stop", 0.0)
    return phases


def measure(transport: str, url: str | None, runs: int) -> dict[str, list[float]]:
    """``runs`` one-task runs on ``transport`` (after WARM_UP_RUNS); phase -> ms per run."""
    exchange = f"bench-{uuid.uuid4().hex[:8]}"
    measured: dict[str, list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="fe-bench-fs-") as folder:
        conn = br.connection("flowengine", transport, url, folder)
        with br.workers("flowengine", transport, exchange, conn):
            for i in range(WARM_UP_RUNS + runs):
                phases = one_run(exchange, conn)
                if i >= WARM_UP_RUNS:
                    for phase, ms in phases.items():
                        measured[phase].append(ms)
    return measured


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def table(results: dict[str, dict[str, list[float]]]) -> Iterator[str]:
    """Markdown rows: one per transport measured."""
    yield "| transport | " + " | ".join(title for title, _ in COLUMNS) + " |"
    yield "|---|" + "---|" * len(COLUMNS)
    for transport, phases in results.items():
        yield (
            f"| {transport} | "
            + " | ".join(_cell(phases.get(phase, [])) for _, phase in COLUMNS)
            + " |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--transport",
        choices=br.TRANSPORTS,
        action="append",
        help="transports to measure (repeatable; default: all)",
    )
    p.add_argument("--runs", type=int, default=RUNS, help="fresh engines per transport")
    args = p.parse_args(argv)
    transports = args.transport or list(br.TRANSPORTS)
    instrument()
    results: dict[str, dict[str, list[float]]] = {}
    for transport in transports:
        # One broker at a time: a RabbitMQ still settling after its start
        # would otherwise take CPU from the runs on the other transports.
        with br.broker_urls([transport]) as urls:
            if transport in ("redis", "amqp") and not urls.get(transport):
                continue  # its broker could not start (said on stderr)
            results[transport] = measure(transport, urls.get(transport), args.runs)
        print(f"# {transport}: {args.runs} runs", file=sys.stderr, flush=True)
    print(
        f"\nOne-task run() in phases (ms; median [min-max] of {args.runs} fresh engines,"
        " workers up)"
    )
    for row in table(results):
        print(row)
    print(
        "(start: the executor's start, of which consumer up: waiting for its reply consumer"
        " to connect, declare and consume; task: the rest of run() between start and stop;"
        " stop: the executor's stop)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
