#!/usr/bin/env python3
"""The CPU each side of a remote task spends, measured apart: engine per task, worker per request.

bench_remote.py's latency moves by 10-20 % between runs on a shared machine,
more than most single changes to the request path. This script measures what
each side's code costs, one side at a time, on the memory transport, every
measurement in a fresh process pinned to one CPU, and takes turns between
this tree and another (``--baseline``), so two trees are told apart within
a few per cent::

    python tools/bench/bench_sides.py                              # this tree
    python tools/bench/bench_sides.py --baseline /tmp/main-worktree --repeat 5

- ``worker``: a real Worker (4 threads) takes requests this process
  published ahead (``--requests`` per round) and answers each to a queue
  nobody reads; the figure is the process's CPU per request, the publishing
  thread's left out.
- ``engine``: a real worker-based engine runs a linear flow
  (``--tasks`` per round) against a minimal fake worker (flowengine's
  proxy answering PENDING with the acknowledgement, then SUCCESS); the
  figure is the process's CPU per task during ``run()``, the fake worker's
  thread left out.

Each process runs ``--rounds`` rounds and reports the median of all but the
first (warming up); the table shows the median and [min-max] of those over
the ``--repeat`` processes of each tree and side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))

SIDES = ("worker", "engine")

#: Requests a worker takes per round, and tasks per engine round: enough for
#: a second or so of CPU, so that the process's start and the round's edges
#: weigh little.
WORKER_REQUESTS = 4000
ENGINE_TASKS = 2000

#: Rounds per process (the first warms up and is left out) and processes per tree.
ROUNDS = 4
REPEAT = 3

#: Threads of the measured worker (as bench_remote.py's workers have).
WORKER_THREADS = 4

#: Bounds a hang only (s): a round takes about a second.
ROUND_TIMEOUT_S = 120.0
CHILD_TIMEOUT_S = 600.0

TOPIC = "bench"


# --------------------------------------------------------------------------
# the measurements (child side)
# --------------------------------------------------------------------------


def _wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.002)


def measure_worker(requests: int, rounds: int) -> list[float]:
    """CPU (us) per request of a worker draining requests published ahead, per round."""
    import bench_remote_tasks

    from flowengine.engines.worker_based import protocol as pr
    from flowengine.engines.worker_based.messaging import proxy as px
    from flowengine.engines.worker_based.messaging.settings import BrokerSettings
    from flowengine.engines.worker_based.wire import clock
    from flowengine.engines.worker_based.worker_side import worker as worker_mod

    exchange = f"sides-{uuid.uuid4().hex[:8]}"
    worker = worker_mod.Worker(
        exchange, TOPIC, [bench_remote_tasks.Noop], threads_count=WORKER_THREADS, transport="memory"
    )
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    if not worker.wait(ROUND_TIMEOUT_S):
        raise RuntimeError("worker did not start")
    client = px.Proxy("client", exchange, None, broker=BrokerSettings(transport="memory"))
    task = bench_remote_tasks.Noop("t0")
    totals = worker.activity.totals
    per_request = []
    try:
        for _ in range(rounds):
            # Encoded before the clock starts: only publishing is left in the round.
            ready = []
            for _ in range(requests):
                request = pr.Request(task, uuid.uuid4().hex, pr.EXECUTE, {}, timeout=60)
                now = clock.wall()
                ready.append(
                    client.prepare(
                        request,
                        TOPIC,
                        reply_to="nobody",
                        correlation_id=request.uuid,
                        headers={
                            pr.HEADER_ATTEMPT: 0,
                            pr.HEADER_ORIGIN: "bench:1",
                            "request_id": uuid.uuid4().hex,
                            pr.HEADER_EXPIRES: now + 600,
                            "heartbeat_misses": 3,
                            "created": now,
                            "enqueued": now,
                        },
                    )
                )
            done = totals.succeeded + totals.failed + requests
            cpu, publisher = time.process_time(), time.thread_time()
            for outgoing in ready:
                client.send([outgoing])
            publisher = time.thread_time() - publisher
            _wait_until(
                lambda done=done: totals.succeeded + totals.failed >= done,
                "the worker to answer every request",
            )
            if totals.failed:
                raise RuntimeError(f"{totals.failed} request(s) failed")
            per_request.append((time.process_time() - cpu - publisher) / requests * 1e6)
    finally:
        worker.stop()
        thread.join(ROUND_TIMEOUT_S)
    return per_request


class _FakeWorker:
    """Answers NOTIFY with its task, and each request PENDING (acknowledging it), then SUCCESS."""

    def __init__(self, exchange: str, task_cls: str) -> None:
        from flowengine.engines.worker_based import protocol as pr
        from flowengine.engines.worker_based.messaging import dispatcher
        from flowengine.engines.worker_based.messaging import proxy as px
        from flowengine.engines.worker_based.messaging.settings import BrokerSettings

        self._pr = pr
        self._task_cls = task_cls
        self._headers = {
            pr.HEADER_WORKER_ID: f"fake-{uuid.uuid4().hex}",
            pr.HEADER_ORIGIN: "bench:2",
            "heartbeat": 2.0,
        }
        handlers = {
            pr.REQUEST: dispatcher.Handler(self._request, settles=True),
            pr.NOTIFY: dispatcher.Handler(self._notify),
        }
        self.proxy = px.Proxy(TOPIC, exchange, handlers, broker=BrokerSettings(transport="memory"))
        #: Its thread's CPU time (s) when it first took a request this round, and last.
        self.first_cpu: float | None = None
        self.last_cpu = 0.0

    def _request(self, data: Any, message: Any) -> None:
        if self.first_cpu is None:
            self.first_cpu = time.thread_time()
        pr = self._pr
        props = message.properties
        headers = dict(self._headers, attempt=message.headers.get(pr.HEADER_ATTEMPT, 0))
        self.proxy.publish(
            pr.Response(pr.PENDING),
            props["reply_to"],
            correlation_id=props["correlation_id"],
            headers=headers,
            settles=message,
        )
        self.proxy.publish(
            pr.Response(pr.SUCCESS, result=None),
            props["reply_to"],
            correlation_id=props["correlation_id"],
            headers=dict(headers, run_s=0.0),
        )
        self.last_cpu = time.thread_time()

    def _notify(self, data: Any, message: Any) -> None:
        pr = self._pr
        self.proxy.publish(
            pr.Notify(topic=TOPIC, tasks=[self._task_cls]),
            message.properties["reply_to"],
            correlation_id=message.properties.get("correlation_id"),
            headers=self._headers,
        )


def measure_engine(tasks: int, rounds: int) -> list[float]:
    """CPU (us) per task of an engine running linear flows against a fake worker, per round."""
    import bench_remote_tasks

    from flowengine import engines
    from flowengine.patterns import linear_flow
    from flowengine.utils import reflection

    exchange = f"sides-{uuid.uuid4().hex[:8]}"
    fake = _FakeWorker(exchange, reflection.get_class_name(bench_remote_tasks.Noop))
    thread = threading.Thread(target=fake.proxy.start, daemon=True)
    thread.start()
    if not fake.proxy.wait(ROUND_TIMEOUT_S):
        raise RuntimeError("fake worker did not start")
    per_task = []
    try:
        for _ in range(rounds):
            flow = linear_flow.Flow("chain").add(
                *[bench_remote_tasks.Noop(f"t{i}") for i in range(tasks)]
            )
            engine = engines.load(
                flow, engine="worker-based", exchange=exchange, topics=[TOPIC], transport="memory"
            )
            engine.compile()
            engine.prepare()
            engine.validate()
            fake.first_cpu = None
            cpu = time.process_time()
            engine.run()
            cpu = time.process_time() - cpu - (fake.last_cpu - (fake.first_cpu or 0.0))
            per_task.append(cpu / tasks * 1e6)
    finally:
        fake.proxy.stop()
        thread.join(ROUND_TIMEOUT_S)
    return per_task


# --------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------


def run_child(tree: str, side: str, n: int, rounds: int, cpu: int) -> float:
    """One process measuring ``side`` of ``tree``: the median of its rounds but the first."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, tree]))
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--role",
        side,
        "--n",
        str(n),
        "--rounds",
        str(rounds),
        "--cpu",
        str(cpu),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=HERE, timeout=CHILD_TIMEOUT_S
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{side} of {tree}: exit {proc.returncode}: {last}")
    values = json.loads(proc.stdout.strip().splitlines()[-1])
    return statistics.median(values[1:] if len(values) > 1 else values)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--side", choices=SIDES, action="append", help="side to measure (repeatable; default: both)"
    )
    p.add_argument(
        "--baseline",
        metavar="TREE",
        help="another flowengine source tree, measured taking turns with this one",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=REPEAT,
        help="processes per tree and side (default %(default)s)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help="rounds per process, the first left out (default %(default)s)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=WORKER_REQUESTS,
        help="requests per worker round (default %(default)s)",
    )
    p.add_argument(
        "--tasks",
        type=int,
        default=ENGINE_TASKS,
        help="tasks per engine round (default %(default)s)",
    )
    p.add_argument(
        "--cpu",
        type=int,
        default=max(os.sched_getaffinity(0)),
        help="the CPU every measuring process runs on (default: the last one)",
    )
    p.add_argument("--json", action="store_true", help="also print every figure as JSON")
    # Child role (internal).
    p.add_argument("--role", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.role is not None:
        # Before any thread starts: they inherit it.
        os.sched_setaffinity(0, {args.cpu})
        measure = measure_worker if args.role == "worker" else measure_engine
        print(json.dumps(measure(args.n, args.rounds)))
        sys.stdout.flush()
        os._exit(0)  # the worker's and fake worker's daemon threads may linger

    if args.cpu not in os.sched_getaffinity(0):
        p.error(f"--cpu {args.cpu}: not one of the CPUs this process may use")
    trees = {"flowengine": REPO_ROOT}
    if args.baseline:
        trees["baseline"] = os.path.abspath(args.baseline)
    sides = args.side or list(SIDES)
    sizes = {"worker": args.requests, "engine": args.tasks}
    figures: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.repeat):
        for side in sides:
            for name, tree in trees.items():
                value = run_child(tree, side, sizes[side], args.rounds, args.cpu)
                figures.setdefault((side, name), []).append(value)
                print(f"# {rep} {side:<6} {name:<10} {value:7.1f} us", file=sys.stderr, flush=True)
    units = {"worker": "worker request", "engine": "engine task"}
    print(
        f"\nCPU per {' / '.join(units[side] for side in sides)} (us; memory transport,"
        f" CPU {args.cpu} only; median [min-max] of {args.repeat} processes, each the"
        f" median of its rounds but the first)"
    )
    print("| side | " + " | ".join(trees) + (" | flowengine/baseline |" if args.baseline else " |"))
    print("|---" * (len(trees) + 1 + bool(args.baseline)) + "|")
    for side in sides:
        cells = []
        for name in trees:
            values = figures[(side, name)]
            cells.append(f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]")
        row = f"| {side} | " + " | ".join(cells)
        if args.baseline:
            ratio = statistics.median(figures[(side, "flowengine")]) / statistics.median(
                figures[(side, "baseline")]
            )
            row += f" | {ratio:.3f}x"
        print(row + " |")
    if args.json:
        print(json.dumps({f"{side}/{name}": v for (side, name), v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
