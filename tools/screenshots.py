#!/usr/bin/env python3
"""Make the pictures in the docs: the events view, a flow graph, the request path, the dashboard.

Runs real workers with events on (memory transport, in this process), runs
the demo flow on them,
feeds the events into the same view ``flowengine events`` draws and saves it
with rich's SVG export; then draws the demo flow with Graphviz (DOT text is
always written; SVG needs the ``dot`` program); then serves the web dashboard
over two in-process workers and a few persisted shop orders and takes its
pictures with Debian's headless Chromium driven by Playwright: idle (orders
done, none running), running (one order held), a failed order's page with
its timeline, and the history filtered to failed orders
(``dashboard*.png``; skipped, saying so, without them). The dashboard runs
with a token, so its action buttons show. Output
goes to ``doc/source/_static/`` by default::

    python tools/screenshots.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
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
from flowengine.engines.worker_based.worker_side.worker_events import EventsMiddleware  # noqa: E402

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
        t = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
        t.start()
        assert worker.wait(WAIT_S)
        workers.append(worker)
        pools.append(pool)
        threads.append(t)
    try:
        engine = engines.load(
            demo_flow.make_flow(SOURCES),
            engine="worker-based",
            exchange=exchange,
            topics=["demo"],
            events=True,
            **conn,
        )
        engine.run()
        assert done.wait(WAIT_S), "no flow-finished event"
        # Heartbeats make the view's worker lines current.
        for worker in workers:
            events = next(m for m in worker.middleware if isinstance(m, EventsMiddleware))
            events._topic("demo").last_heartbeat = 0.0  # due now
            events.on_consumer_period("demo")
            events.publisher.flush()
        for _ in workers:
            assert beats.acquire(timeout=WAIT_S), "no heartbeat after the run"
        console = Console(
            record=True, width=VIEW_COLUMNS, force_terminal=True, file=open(os.devnull, "w")
        )  # noqa: SIM115 - lives as long as the script
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
    subprocess.run(
        [dot, "-Tsvg", REQUEST_PATH_DOT, "-o", os.path.join(out, "request-path.svg")], check=True
    )


#: Debian's Chromium and the flags of a headless one that talks only to the page.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

#: Orders run before the pictures (even ones succeed, odd ones fail): the
#: throughput chart needs a few rounds of them.
SHOP_ORDERS = 12


#: The token the photographed dashboard requires (its buttons show with one).
DEMO_TOKEN = "screenshots-token-0123456789abcdef"


def _serve_dashboard(live, flows):  # -> (server, thread, url)
    import socket

    import uvicorn

    from flowengine.dashboard import app as app_mod
    from flowengine.dashboard import auth
    from flowengine.dashboard.actions import Actions

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = app_mod.build_app(
        live, flows, auth.Credentials(token=DEMO_TOKEN), Actions(live.exchange, live.broker, flows)
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    done = threading.Event()
    while not server.started:
        assert thread.is_alive(), "the dashboard server did not start"
        done.wait(0.05)
    return server, thread, f"http://127.0.0.1:{port}/"


def dashboard_pictures(out: str) -> None:
    """Serve the dashboard over in-process workers and persisted orders; photograph it."""
    import tempfile

    try:
        from playwright.sync_api import sync_playwright

        from flowengine.dashboard.flows import FlowsSource
        from flowengine.dashboard.live import LiveState
    except ImportError as e:
        print(f"dashboard pictures not taken: {e}", file=sys.stderr)
        return
    if not os.path.exists(CHROMIUM):
        print(f"dashboard pictures not taken: {CHROMIUM} is missing", file=sys.stderr)
        return
    import dashboard_shop  # tools/, beside this script

    from flowengine.engines.worker_based.messaging.settings import BrokerSettings
    from flowengine.persistence import backends, models, run_records

    exchange, conn = "shop", {"transport": "memory"}
    with tempfile.TemporaryDirectory(prefix="flowengine-shots-") as tmp:
        backend_conf = f"dir:{tmp}/store"
        backend = backends.fetch({"connection": "dir", "path": f"{tmp}/store"})
        with contextlib.closing(backend.get_connection()) as c:
            c.upgrade()
        book = models.LogBook("shop")
        workers = [
            wk.Worker(
                exchange,
                topics,
                [dashboard_shop],
                threads_count=2,
                worker_id=f"shop-{i}",
                events=True,
                default_exception_handler=False,  # declined cards: expected
                **conn,
            )
            for i, topics in enumerate((["billing", "shipping"], ["billing"]))
        ]
        threads = [
            threading.Thread(target=w.run, kwargs={"display_banner": False}, daemon=True)
            for w in workers
        ]
        for t in threads:
            t.start()
        for w in workers:
            assert w.wait(WAIT_S)
        live = LiveState(exchange, BrokerSettings(None, "memory", {}), poll_period_s=0.5)
        live.start()

        def order(number: int, hold: bool = False) -> None:
            engine = engines.load_from_factory(
                dashboard_shop.make_shop,
                store={"order_id": number, "hold": hold},
                book=book,
                backend=backend,
                engine="worker-based",
                exchange=exchange,
                topics=["billing"],
                remote_exceptions="original",
                **conn,
            )
            # As `flowengine run` does: times, workers and the timeline recorded.
            run_records.Recorder(engine, "worker-based").start()
            try:
                engine.run()
            except RuntimeError:
                pass  # the odd orders' declined cards: the flow reverts

        for number in range(2, 2 + SHOP_ORDERS):
            order(number)
        held = threading.Thread(target=order, args=(1000,), kwargs={"hold": True}, daemon=True)
        server, server_thread, url = _serve_dashboard(live, FlowsSource(backend_conf))
        wait_ms = WAIT_S * 1000
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                # Signed in: the token the page would ask for, given beforehand.
                page.add_init_script(
                    f"sessionStorage.setItem('flowengine-dashboard-token', {DEMO_TOKEN!r})"
                )
                page.goto(url)
                page.wait_for_selector("#workers tbody tr[data-worker-id]", timeout=wait_ms)
                page.wait_for_selector(
                    f"#flows-count:has-text('{SHOP_ORDERS} flow(s)')", timeout=wait_ms
                )
                page.screenshot(path=os.path.join(out, "dashboard-idle.png"))
                held.start()
                page.wait_for_selector("#requests tbody tr[data-uuid]", timeout=wait_ms)
                page.wait_for_selector("#flows tbody tr:has-text('RUNNING')", timeout=wait_ms)
                page.screenshot(path=os.path.join(out, "dashboard.png"))
                page.click("#flows tbody tr:has-text('REVERTED')")
                page.wait_for_selector("#atoms tbody tr[data-atom='charge']", timeout=wait_ms)
                page.wait_for_selector("#timeline .lane", timeout=wait_ms)
                page.wait_for_function(
                    "document.querySelector('#graph').naturalWidth > 0", timeout=wait_ms
                )
                page.click("#atoms tr[data-atom='charge'] button.traceback-toggle")
                page.locator("#persisted").screenshot(path=os.path.join(out, "dashboard-flow.png"))
                page.select_option("#filter-state", "REVERTED")
                page.fill("#filter-name", "order")
                page.dispatch_event("#filter-name", "change")
                page.wait_for_function(
                    "document.querySelector('#flows-count').dataset.query"
                    " === 'state=REVERTED&name=order'",
                    timeout=wait_ms,
                )
                # The filtered list only (the flow shown below it is the picture before).
                clip = page.evaluate("""() => {
                    const top = document.querySelector('#persisted').getBoundingClientRect();
                    const end = document.querySelector('#flows').getBoundingClientRect();
                    return {x: top.left + scrollX, y: top.top + scrollY, width: top.width,
                            height: end.bottom - top.top + 8};
                }""")
                page.screenshot(
                    path=os.path.join(out, "dashboard-history.png"), full_page=True, clip=clip
                )
                browser.close()
        finally:
            dashboard_shop.HOLD.set()
            if held.is_alive():
                held.join(WAIT_S)
            server.should_exit = True
            server_thread.join(WAIT_S)
            for w in workers:
                w.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "doc", "source", "_static"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    events_view_svg(os.path.join(args.out, "events-view.svg"))
    flow_graph(args.out)
    request_path(args.out)
    dashboard_pictures(args.out)
    print(f"Wrote pictures to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
