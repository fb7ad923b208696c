"""``flowengine conductor``: claim jobs from a board and run them until stopped.

One process, ``--concurrency`` jobs at once (1: the blocking conductor;
more: the nonblocking one). Flows are rebuilt from the factories their
posters recorded, so those modules must be importable here (the current
directory is). SIGTERM/SIGINT: stop claiming and abandon every job in
progress at once (others take them over now, not after a lease); a second
signal exits without waiting for running tasks.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

LOG = logging.getLogger("flowengine.conductor")

#: After a stop, how long the conductor waits for its engines to wind down
#: (running atoms finish, their results are saved) before exiting anyway:
#: its jobs are already back on the board, so nothing waits on this.
STOP_GRACE_S = 30.0
#: Conductor events logged at INFO (the rest at DEBUG).
_LOGGED_EVENTS = (
    "job_claimed",
    "job_consumed",
    "job_abandoned",
    "job_trashed",
    "job_lost",
    "job_dead",
)


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add the ``conductor`` subcommand to the ``flowengine`` parser."""
    p = sub.add_parser("conductor", help="run the jobs of a jobboard until SIGTERM")
    p.add_argument(
        "--board",
        default=None,
        metavar="URL",
        help="jobboard URL: redis://host:6379/0, postgresql://..., sqlite:///f.db"
        " (default: $FLOWENGINE_BOARD)",
    )
    p.add_argument(
        "--persistence",
        default=None,
        metavar="URL",
        help="where the jobs' logbooks are: postgresql://..., sqlite:///f.db,"
        " dir:///path (default: $FLOWENGINE_PERSISTENCE)",
    )
    p.set_defaults(needs_urls=("board", "persistence"))
    p.add_argument(
        "--name",
        default="conductor",
        help="conductor name (claims are made under it; default 'conductor')",
    )
    p.add_argument("--board-name", default="flowengine", help="jobboard name")
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="jobs at once (default 1: the blocking conductor)",
    )
    p.add_argument(
        "--engine",
        default=None,
        help="engine for every job (serial, parallel, worker-based); a job's"
        " details may choose another",
    )
    p.add_argument(
        "--engine-option",
        dest="engine_options",
        default=[],
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="engine option (repeatable; values parsed as JSON)",
    )
    p.add_argument(
        "--board-option",
        dest="board_options",
        default=[],
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="jobboard option, e.g. lease_s=10, max_attempts=5 (repeatable)",
    )
    p.add_argument(
        "--no-job-engine-options",
        action="store_true",
        help="ignore 'engine'/'engine_options' in jobs' details",
    )


def _log_event(board: Any, event: str, details: dict[str, Any]) -> None:
    job = details.get("job")
    what = f"{event} {getattr(job, 'uuid', '?')}"
    outcome = None
    if event == "job_consumed" and job is not None:
        try:
            found = board.outcome(job)
            outcome = found.outcome if found is not None else None
        except Exception:  # the line matters more than the detail
            outcome = None
    LOG.log(
        logging.INFO if event in _LOGGED_EVENTS else logging.DEBUG,
        "%s%s (%s)",
        what,
        f" {outcome}" if outcome else "",
        getattr(job, "name", ""),
    )


def run(args: argparse.Namespace) -> int:
    """Connect, conduct until a signal, then abandon what runs and exit."""
    from flowengine.commands import loading
    from flowengine.conductors import backends as conductors
    from flowengine.jobs import backends as boards
    from flowengine.persistence import backends as persistence

    if args.concurrency < 1:
        print("flowengine conductor: --concurrency must be at least 1", file=sys.stderr)
        return 2
    loading.make_cwd_importable()
    # The persistence upgrade's INFO lines say nothing an operator needs.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    conf: dict[str, Any] = {"board": args.board, **dict(args.board_options)}
    with persistence.backend(args.persistence) as store:
        board = boards.fetch(args.board_name, conf, persistence=store)
        kind = "blocking" if args.concurrency == 1 else "nonblocking"
        options: dict[str, Any] = {
            "persistence": store,
            "engine": args.engine,
            "engine_options": dict(args.engine_options),
            "allow_job_engine_options": not args.no_job_engine_options,
        }
        if kind == "nonblocking":
            options["max_simultaneous_jobs"] = args.concurrency
        conductor = conductors.fetch(kind, args.name, board, **options)
        conductor.connect()
        conductor.notifier.register("*", lambda event, details: _log_event(board, event, details))
        try:
            return _serve(conductor, board, args)
        finally:
            conductor.close()


def _serve(conductor: Any, board: Any, args: argparse.Namespace) -> int:
    done = threading.Event()
    signals: list[str] = []
    errors: list[BaseException] = []

    def stop() -> None:
        conductor.stop()
        if not done.wait(STOP_GRACE_S):
            LOG.warning(
                "engines still busy %.0f s after the stop; exiting (their jobs were abandoned)",
                STOP_GRACE_S,
            )
            logging.shutdown()
            os._exit(1)

    def on_signal(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        signals.append(name)
        if len(signals) > 1:
            LOG.warning("%s again: exiting without waiting for running tasks", name)
            logging.shutdown()
            os._exit(1)
        LOG.info("%s: stopping; abandoning the jobs in progress (send it again to exit now)", name)
        # Not in the handler: it interrupts the main thread mid-bytecode.
        threading.Thread(target=stop, daemon=True, name="flowengine-conductor-stop").start()

    def conduct() -> None:
        try:
            conductor.run()
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            done.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    LOG.info(
        "conductor %s ready on board %s (%s jobs at once)",
        conductor.conductor.name,
        board.name,
        args.concurrency,
    )
    threading.Thread(target=conduct, name="flowengine-conductor", daemon=True).start()
    done.wait()  # signal handlers still run on this thread while it waits
    if errors:
        raise errors[0]
    return 0
