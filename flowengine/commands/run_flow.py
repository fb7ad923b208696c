"""``flowengine run module:flow_factory``: run a flow here with a progress bar."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

#: Engine names accepted by --engine (the entry points of flowengine.engines).
ENGINES = ("serial", "parallel", "worker-based")


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add the ``run`` subcommand to the ``flowengine`` parser."""
    p = sub.add_parser("run", help="run a flow with a progress bar and print its results")
    p.add_argument("flow", metavar="module:flow_factory",
                   help="a function returning a flow (or a flow object)")
    p.add_argument("--engine", default="serial", choices=ENGINES)
    p.add_argument("--store", dest="store", default=[], action="append", type=parse_option,
                   metavar="KEY=VALUE", help="initial value (repeatable; parsed as JSON)")
    p.add_argument("--store-json", default=None, metavar="JSON",
                   help="initial values as one JSON object")
    p.add_argument("--url", default=None, help="broker URL (worker-based engine)")
    p.add_argument("--exchange", default=None, help="exchange (worker-based engine)")
    p.add_argument("--topic", dest="topics", default=[], action="append",
                   help="worker topic (repeatable; worker-based engine)")
    p.add_argument("--transport", default=None, help="kombu transport name")
    p.add_argument("--transport-option", dest="transport_options", default=[],
                   action="append", type=parse_option, metavar="KEY=VALUE",
                   help="transport option (repeatable; values parsed as JSON)")
    p.add_argument("--transition-timeout", type=float, default=None, metavar="SECONDS",
                   help="fail a remote task no worker takes within this many seconds"
                        " (worker-based engine; default 60)")
    p.add_argument("--events", action="store_true",
                   help="publish flow events (worker-based engine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--graph", default=None, metavar="PATH",
                   help="after the run, draw the flow coloured by atom state")


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.engine != "worker-based":
        return {}
    options: dict[str, Any] = {"url": args.url, "exchange": args.exchange,
                               "topics": list(args.topics), "transport": args.transport,
                               "events": args.events,
                               # A task's failure is reported by name below,
                               # as on the local engines.
                               "remote_exceptions": "original",
                               "transition_timeout": args.transition_timeout}
    if args.transport_options:
        options["transport_options"] = dict(args.transport_options)
    return {k: v for k, v in options.items() if v not in (None, [])}


def run(args: argparse.Namespace) -> int:
    """Load, run and report; 1 when the flow fails."""
    from rich.console import Console

    from flowengine import engines
    from flowengine import exceptions as exc
    from flowengine.commands import loading, progress
    from flowengine.engines.worker_based import broker_errors

    console = Console(stderr=True)
    try:
        flow = loading.load_flow(args.flow)
        store = dict(args.store)
        if args.store_json:
            store.update(json.loads(args.store_json))
    except (ValueError, ImportError, AttributeError) as e:
        print(f"flowengine run: {e}", file=sys.stderr)
        return 2
    if args.engine == "worker-based":
        broker_errors.check_shared(args.url, args.transport,
                                   "the workers are other processes")
    engine = engines.load(flow, store=store, engine=args.engine, **_engine_options(args))
    engine.compile()
    total = len(engine.compilation.atoms)
    bar = progress.FlowProgress(total, console=console, description=flow.name)
    bar.attach(engine)
    failed: BaseException | None = None
    interrupts = _Interrupts(engine)
    try:
        with interrupts:
            if args.no_progress:
                engine.run()
            else:
                with bar:
                    engine.run()
    except (exc.BrokerConfigError, exc.BrokerUnavailable):
        raise  # a broker problem, not the flow's: main() says which, in one line
    except Exception as e:  # reported below with the results so far
        failed = e
    results = engine.storage.fetch_all()
    print(json.dumps(_jsonable(results), indent=2, sort_keys=True))
    stats = engine.statistics.get("atoms")
    if stats:
        for name, entry in sorted(stats.items()):
            console.print(f"  {name}: queue {entry.get('queue_time', 0):.3f} s, run"
                          f" {entry.get('run_time', 0):.3f} s, attempts {entry['attempts']}")
    if args.graph:
        engine.draw(args.graph)
    if failed is not None:
        _report_failure(engine, failed, verbose=getattr(args, "verbose", False))
        return 1
    if interrupts.signalled:
        done = sum(1 for name in engine.compilation.atoms
                   if engine.storage.get_atom_state(name) == "SUCCESS")
        print(f"flowengine run: stopped by {interrupts.signalled}: the flow is"
              f" {engine.storage.get_flow_state()} with {done} of {total} tasks done",
              file=sys.stderr)
        return 130
    return 0


class _Interrupts:
    """SIGINT/SIGTERM during a run: first suspend cleanly, then stop now.

    A first signal suspends the engine: no new task starts, the running
    ones finish and their results are kept (a persisted flow can resume).
    A second one raises KeyboardInterrupt: the engine stops its executor,
    which fails what is still running and removes its reply queue from the
    broker, so nothing is left behind either way.
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._previous: dict[int, Any] = {}
        #: Name of the first signal received (None: none).
        self.signalled: str | None = None

    def __enter__(self) -> _Interrupts:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            raise KeyboardInterrupt(f"{name} again")
        self.signalled = name
        print(f"flowengine run: {name}: no new task starts; the running ones finish"
              f" (send it again to stop now)", file=sys.stderr, flush=True)
        # Not from the handler itself: it interrupts the main thread, which
        # may be holding the engine's state lock right now.
        threading.Thread(target=self._engine.suspend, name="flowengine-suspend",
                         daemon=True).start()


def _report_failure(engine: Any, error: BaseException, verbose: bool = False) -> None:
    """Name each task that failed, with its traceback (remote ones as the worker sent it).

    A failure flowengine itself gave a request (no worker took it in time, its
    worker was lost, the broker went away: an ExecutionFailure) says all in
    its message; its traceback is flowengine's own code, shown only with -v.
    """
    from flowengine import exceptions as exc

    failures = engine.storage.get_execute_failures()
    if not failures:
        print(f"flowengine run: the flow failed: {error}", file=sys.stderr)
        return
    for name, failure in sorted(failures.items()):
        kind = next(iter(failure), "Exception")
        print(f"flowengine run: task {name!r} failed: {kind}: {failure.exception_str}",
              file=sys.stderr)
        ours = failure.check(exc.ExecutionFailure) is not None
        if failure.traceback_str and (verbose or not ours):
            print(failure.traceback_str.rstrip(), file=sys.stderr)


def _jsonable(value: Any) -> Any:
    """``value`` as JSON can show it (unknown objects by their repr)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)
