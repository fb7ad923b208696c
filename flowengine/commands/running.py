"""Run a loaded engine for a command: progress bar, signals, results, failures.

Shared by ``flowengine run``, ``flowengine flows resume`` and ``flows retry``:
each loads its engine its own way, then hands it here.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from typing import Any

#: Exit status when a first signal suspended the flow (128 + SIGINT, as shells do).
EXIT_SUSPENDED = 130


def run_engine(
    engine: Any,
    command: str,
    no_progress: bool = False,
    graph: str | None = None,
    resume_hint: str | None = None,
) -> int:
    """Run ``engine``, print its results as JSON; 0, 1 (the flow failed) or 130 (suspended).

    ``command`` prefixes every message ("flowengine run"); ``resume_hint``
    (a command line) is printed when a signal suspended the flow. Broker
    problems are raised, not reported as the flow's failure.
    """
    from rich.console import Console

    from flowengine import exceptions as exc
    from flowengine.commands import progress

    console = Console(stderr=True)
    engine.compile()
    total = len(engine.compilation.atoms)
    bar = progress.FlowProgress(total, console=console, description=engine.storage.flow_name)
    bar.attach(engine)
    failed: BaseException | None = None
    interrupts = Interrupts(engine, command)
    try:
        with interrupts:
            if no_progress:
                engine.run()
            else:
                with bar:
                    engine.run()
    except (exc.BrokerConfigError, exc.BrokerUnavailable):
        raise  # a broker problem, not the flow's: main() says which, in one line
    except Exception as e:  # reported below with the results so far
        failed = e
    results = engine.storage.fetch_all()
    print(json.dumps(jsonable(results), indent=2, sort_keys=True), flush=True)
    stats = engine.statistics.get("atoms")
    if stats:
        for name, entry in sorted(stats.items()):
            if not entry["attempts"]:  # e.g. reverted after its request expired unrun
                console.print(f"  {name}: no execution finished")
                continue
            console.print(
                f"  {name}: queue {entry.get('queue_time', 0):.3f} s, run"
                f" {entry.get('run_time', 0):.3f} s, attempts {entry['attempts']}"
            )
    if graph:
        engine.draw(graph)
    if failed is not None:
        report_failure(engine, failed, command)
        return 1
    if interrupts.signalled:
        done = sum(
            1
            for name in engine.compilation.atoms
            if engine.storage.get_atom_state(name) == "SUCCESS"
        )
        print(
            f"{command}: stopped by {interrupts.signalled}: the flow is"
            f" {engine.storage.get_flow_state()} with {done} of {total} tasks done",
            file=sys.stderr,
        )
        if resume_hint:
            print(f"{command}: resume it with: {resume_hint}", file=sys.stderr)
        return EXIT_SUSPENDED
    return 0


class Interrupts:
    """SIGINT/SIGTERM during a run: first suspend cleanly, then stop now.

    A first signal suspends the engine: no new task starts, the running
    ones finish and their results are kept (a persisted flow can resume).
    A second one raises KeyboardInterrupt: the engine stops its executor,
    which fails what is still running and removes its reply queue from the
    broker, so nothing is left behind either way.
    """

    def __init__(self, engine: Any, command: str = "flowengine run") -> None:
        self._engine = engine
        self._command = command
        self._previous: dict[int, Any] = {}
        #: Name of the first signal received (None: none).
        self.signalled: str | None = None

    def __enter__(self) -> Interrupts:
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
        print(
            f"{self._command}: {name}: no new task starts; the running ones finish"
            f" (send it again to stop now)",
            file=sys.stderr,
            flush=True,
        )
        # Not from the handler itself: it interrupts the main thread, which
        # may be holding the engine's state lock right now.
        threading.Thread(
            target=self._engine.suspend, name="flowengine-suspend", daemon=True
        ).start()


def report_failure(engine: Any, error: BaseException, command: str) -> None:
    """Name each task that failed, with its traceback (remote ones as the worker sent it).

    A failure flowengine itself gave a request (no worker took it in time,
    its worker was lost, the broker went away: an ExecutionFailure) says all
    in its message; its traceback is flowengine's own code, shown only with
    -v (logging at DEBUG).
    """
    from flowengine import exceptions as exc

    verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
    failures = engine.storage.get_execute_failures()
    if not failures:
        print(f"{command}: the flow failed: {error}", file=sys.stderr)
        return
    for name, failure in sorted(failures.items()):
        kind = next(iter(failure), "Exception")
        print(f"{command}: task {name!r} failed: {kind}: {failure.exception_str}", file=sys.stderr)
        ours = failure.check(exc.ExecutionFailure) is not None
        if failure.traceback_str and (verbose or not ours):
            print(failure.traceback_str.rstrip(), file=sys.stderr)


def jsonable(value: Any) -> Any:
    """``value`` as JSON can show it: a failure as its type and message, others by repr."""
    from flowengine.types.failure import Failure

    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, Failure):
            # What a failed task "provides": readable, not "<Failure: ...>".
            return {
                "failure": {
                    "exc_type_names": list(value.exc_type_names),
                    "message": value.exception_str,
                }
            }
        if isinstance(value, dict):
            return {str(k): jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [jsonable(v) for v in value]
        return repr(value)
