#!/usr/bin/env python3
"""Where a remote task's time goes: one clock over the engine and its workers.

Runs a linear flow of trivial tasks on the worker-based engine (2 workers:
processes, or threads for ``memory``) with the engine's and the workers'
steps on the request path wrapped to note when they start and end
(``time.perf_counter_ns``, one system-wide clock, so stamps taken in
different processes compare). Each task's stamps are taken from the
engine's submit of its request to the submit of the next task's; the output
is each step's median offset in that cycle, the gap to the step before, and
the median CPU time of each wrapped step in its own thread::

    python tools/bench/bench_timeline.py --transport amqp --tasks 1500

Steps: ``e.`` the engine (``submit``: build and publish a request; ``resp``:
handle a reply; ``woke``: the engine's thread sees the outcome), ``w.`` a
worker (``req``: take a request; ``accept``: PENDING and the
acknowledgement; ``submit``: hand it to the pool, or run it right there
when it is a chain's short next request (worker_side/short_bodies.py), so
``perform`` then falls inside ``submit``; ``perform``: run it and send the
outcome), ``put``: one publication, ``rx``: one received message.
The wrappers cost about a microsecond a stamp: the cycle is a little longer
than ``bench_remote.py``'s per-task latency. A diagnostic, not a benchmark:
compare two trees with ``bench_remote.py --baseline`` (interleaved runs).
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import bench_remote as br

# This tree's flowengine (as bench_remote.py's cases get), not an installed one.
sys.path.insert(0, br.REPO_ROOT)

#: (time ns, step, thread id) of every stamp taken in this process.
STAMPS: list[tuple[int, str, int]] = []
#: step -> CPU ns of each call, in its thread.
CPU: dict[str, list[int]] = collections.defaultdict(list)

#: Name start of the file each worker process writes its stamps to.
WORKER_STAMPS_PREFIX = "timeline-worker-"

#: Share of the cycles left out at the start (connections and caches warming up).
WARM_UP_SHARE = 0.1


def _wrap(
    cls: Any, name: str, label: Callable[[], str] | str, tag: Callable[..., str] | None = None
) -> None:
    """Stamp the start and end of ``cls.name`` (and its CPU time) under ``label``."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def stamped(*args: Any, **kwargs: Any) -> Any:
        step = label() if callable(label) else label
        if tag is not None:
            step += tag(*args, **kwargs)
        ident = threading.get_ident()
        cpu = time.thread_time_ns()
        STAMPS.append((time.perf_counter_ns(), step + ">", ident))
        try:
            return original(*args, **kwargs)
        finally:
            STAMPS.append((time.perf_counter_ns(), step + "<", ident))
            CPU[step].append(time.thread_time_ns() - cpu)

    setattr(cls, name, stamped)


def _side() -> str:
    """``w`` on a worker's thread, ``e`` elsewhere (workers in this process: memory)."""
    worker_threads = ("flowengine-consume-", "flowengine-pool-")
    return "w" if threading.current_thread().name.startswith(worker_threads) else "e"


def instrument(side: str | None) -> None:
    """Wrap the steps of ``side`` (``e``, ``w``; None: both, told apart by thread)."""
    from flowengine.engines.action_engine import builder
    from flowengine.engines.worker_based.executor_side import publisher as request_publisher
    from flowengine.engines.worker_based.executor_side import replies
    from flowengine.engines.worker_based.messaging import consumer, publisher
    from flowengine.engines.worker_based.worker_side import intake, performer, replier

    _wrap(
        publisher.Publisher, "_put", (lambda: _side() + ".put") if side is None else f"{side}.put"
    )
    _wrap(consumer.Consumer, "_handle", (lambda: _side() + ".rx") if side is None else f"{side}.rx")
    if side in (None, "e"):
        _wrap(request_publisher.RequestPublisher, "submit", "e.submit")
        _wrap(
            replies.ReplyHandler,
            "process_response",
            "e.resp",
            lambda self, data, message: ":" + str(data.get("state")),
        )
        wait = builder._wait

        def stamped_wait(*args: Any, **kwargs: Any) -> Any:
            done = wait(*args, **kwargs)
            STAMPS.append((time.perf_counter_ns(), "e.woke", threading.get_ident()))
            return done

        builder._wait = stamped_wait
    if side in (None, "w"):
        _wrap(intake.Intake, "process_request", "w.req")
        _wrap(replier.Replier, "accept", "w.accept")
        _wrap(performer.Performer, "submit", "w.submit")
        _wrap(performer.Performer, "perform", "w.perform")


def worker_main(exchange: str, conn: dict[str, Any], out_dir: str) -> int:
    """bench_remote.py's worker process, stamped; its stamps go to ``out_dir`` at the end."""
    instrument("w")
    status = br.worker_main("flowengine", exchange, conn)
    with open(os.path.join(out_dir, f"{WORKER_STAMPS_PREFIX}{os.getpid()}.json"), "w") as f:
        json.dump({"stamps": STAMPS, "cpu": CPU}, f)
    return status


def run(transport: str, tasks: int) -> list[tuple[int, str, str]]:
    """Run the flow; every stamp as (time ns, step, who), in time order."""
    import bench_remote_tasks

    from flowengine import engines
    from flowengine.patterns import linear_flow

    with br.broker_urls([transport]) as urls, tempfile.TemporaryDirectory() as folder:
        conn = br.connection("flowengine", transport, urls.get(transport), folder)
        exchange = f"timeline-{uuid.uuid4().hex[:8]}"
        in_process = transport == "memory"
        instrument(None if in_process else "e")
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--role",
            "worker",
            "--exchange",
            exchange,
            "--conn",
            json.dumps(conn),
            "--out-dir",
            folder,
        ]
        with br.workers("flowengine", transport, exchange, conn, command=command):
            flow = linear_flow.Flow("chain").add(
                *[bench_remote_tasks.Noop(f"t{i}") for i in range(tasks)]
            )
            engines.load(
                flow, engine="worker-based", exchange=exchange, topics=[br.TOPIC], **conn
            ).run()
        stamps = [(t, step, f"engine:{ident % 10000}") for t, step, ident in STAMPS]
        # Each worker process wrote its stamps as it ended (none on memory).
        outs = sorted(glob.glob(os.path.join(folder, f"{WORKER_STAMPS_PREFIX}*.json")))
        for i, out in enumerate(outs):
            with open(out) as f:
                taken = json.load(f)
            stamps += [
                (t, step, f"worker{i}:{ident % 10000}") for t, step, ident in taken["stamps"]
            ]
            for step, values in taken["cpu"].items():
                CPU[step] += values
    return sorted(stamps)


def cycles(stamps: list[tuple[int, str, str]]) -> list[list[tuple[int, str, str]]]:
    """The stamps cut at each request the engine submits, each with the next submit's."""
    found: list[list[tuple[int, str, str]]] = []
    current: list[tuple[int, str, str]] | None = None
    for stamp in stamps:
        if stamp[1] == "e.submit>":
            if current is not None:
                current.append((stamp[0], "next e.submit>", stamp[2]))
                found.append(current)
            current = [stamp]
        elif current is not None:
            current.append(stamp)
    return found[int(len(found) * WARM_UP_SHARE) :]


def report(transport: str, found: list[list[tuple[int, str, str]]]) -> None:
    offsets: dict[str, list[float]] = collections.defaultdict(list)
    for cycle in found:
        start = cycle[0][0]
        seen: collections.Counter[str] = collections.Counter()
        for t, step, _who in cycle:
            key = step if not seen[step] else f"{step}#{seen[step]}"
            seen[step] += 1
            offsets[key].append((t - start) / 1000.0)
    print(
        f"{transport}: {len(found)} tasks; median offset in the cycle (us), gap to the"
        " step before, and how many cycles had the step"
    )
    rows = sorted(
        (statistics.median(v), k, len(v)) for k, v in offsets.items() if len(v) > len(found) / 2
    )
    previous = 0.0
    for offset, step, count in rows:
        print(f"  {offset:8.0f}  (+{offset - previous:5.0f})  {step}  [{count}]")
        previous = offset
    print("CPU of each step in its thread (median us):")
    for step, values in sorted(CPU.items()):
        print(f"  {step:16s} {statistics.median(values) / 1000.0:7.1f}  (n={len(values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--transport", default="amqp", choices=["memory", "filesystem", "redis", "amqp"]
    )
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--role", default="engine", choices=["engine", "worker"])
    parser.add_argument("--exchange")
    parser.add_argument("--conn")
    parser.add_argument("--out-dir")
    args = parser.parse_args()
    if args.role == "worker":
        return worker_main(args.exchange, json.loads(args.conn), args.out_dir)
    report(args.transport, cycles(run(args.transport, args.tasks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
