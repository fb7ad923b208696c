#!/usr/bin/env python3
"""Make the pictures in the docs: the events view, a flow graph, the request path (SVG).

Runs real workers with events on (memory transport, in this process), runs
the demo flow on them,
feeds the events into the same view ``flowengine events`` draws and saves it
with rich's SVG export; then draws the demo flow with Graphviz (DOT text is
always written; SVG needs the ``dot`` program). Output goes to
``doc/source/_static/`` by default::

    python tools/screenshots.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from concurrent import futures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from flowengine import engines  # noqa: E402
from flowengine.commands import events_view  # noqa: E402
from flowengine.demo import flow as demo_flow  # noqa: E402
from flowengine.demo import tasks as demo_tasks  # noqa: E402
from flowengine.engines.action_engine import graph_draw  # noqa: E402
from flowengine.engines.worker_based import events as ev  # noqa: E402
from flowengine.engines.worker_based.worker_side import worker as wk  # noqa: E402

#: Seconds any wait may take before the script gives up.
WAIT_S = 60.0

#: Sources of the demo flow drawn and run: 4 gives 16 tasks, a readable picture.
SOURCES = 4

#: Width (columns) of the events view picture.
VIEW_COLUMNS = 118


def events_view_svg(path: str) -> None:
    """Run the demo flow on two workers and save the events view as SVG."""
    from rich.console import Console

    exchange = "screenshot"
    conn = {"transport": "memory"}
    state = events_view.EventsState()
    done = threading.Event()
    beats = threading.Semaphore(0)

    def handle(event: dict) -> None:
        state.apply(event)
        if event["type"] == "flow-finished":
            done.set()
        elif event["type"] == "worker-heartbeat" and done.is_set():
            beats.release()

    receiver = ev.EventReceiver(exchange, handle, **conn)
    thread = threading.Thread(target=receiver.run, daemon=True)
    thread.start()
    assert receiver.wait_ready(WAIT_S)
    workers, pools, threads = [], [], []
    for topic in ("demo", "demo"):
        pool = futures.ThreadPoolExecutor(max_workers=2)
        worker = wk.Worker(exchange, topic, [demo_tasks], executor=pool, events=True, **conn)
        t = threading.Thread(target=worker.run, kwargs={"display_banner": False},
                             daemon=True)
        t.start()
        assert worker.wait(WAIT_S)
        workers.append(worker)
        pools.append(pool)
        threads.append(t)
    try:
        engine = engines.load(demo_flow.make_flow(SOURCES), engine="worker-based",
                              exchange=exchange, topics=["demo"], events=True, **conn)
        engine.run()
        assert done.wait(WAIT_S), "no flow-finished event"
        # Heartbeats make the view's worker lines current.
        for worker in workers:
            worker.server._events._last_heartbeat = 0.0
            worker.server._events.heartbeat()
            worker.server._events.publisher.flush()
        for _ in workers:
            assert beats.acquire(timeout=WAIT_S), "no heartbeat after the run"
        console = Console(record=True, width=VIEW_COLUMNS, force_terminal=True,
                          file=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the script
        console.print(events_view.render(state, "memory:// / screenshot"))
        console.save_svg(path, title="flowengine events")
    finally:
        for worker, pool in zip(workers, pools, strict=True):
            worker.stop()
            pool.shutdown()
        receiver.stop()
        thread.join(WAIT_S)


def flow_graph(out: str) -> None:
    """Draw the demo flow: DOT always, SVG when Graphviz is installed."""
    flow = demo_flow.make_flow(SOURCES)
    graph_draw.write(flow, os.path.join(out, "demo-flow.dot"), title=flow.name)
    if graph_draw.dot_program() is not None:
        graph_draw.write(flow, os.path.join(out, "demo-flow.svg"), title=flow.name)
    else:
        print("dot not installed: demo-flow.svg not redrawn", file=sys.stderr)


#: Hand-written DOT source of the architecture page's picture (kept in the docs).
REQUEST_PATH_DOT = os.path.join(ROOT, "doc", "source", "_static", "request-path.dot")


def request_path(out: str) -> None:
    """Render the request path picture of the architecture page (needs ``dot``)."""
    dot = graph_draw.dot_program()
    if dot is None:
        print("dot not installed: request-path.svg not redrawn", file=sys.stderr)
        return
    subprocess.run([dot, "-Tsvg", REQUEST_PATH_DOT, "-o",
                    os.path.join(out, "request-path.svg")], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "doc", "source", "_static"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    events_view_svg(os.path.join(args.out, "events-view.svg"))
    flow_graph(args.out)
    request_path(args.out)
    print(f"Wrote pictures to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
