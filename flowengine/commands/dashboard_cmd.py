"""``flowengine dashboard``: serve the web dashboard until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from flowengine.commands import broker_options

#: Where the dashboard listens unless told: this machine only, since the page
#: shows task arguments, results and tracebacks (and has no login unless given
#: credentials).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5555

#: Seconds open pages (event streams never end by themselves) get to close
#: on shutdown before they are cut.
GRACEFUL_SHUTDOWN_S = 2


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add ``dashboard`` to the ``flowengine`` parser."""
    p = sub.add_parser("dashboard", help="web page of live workers, throughput and flows")
    broker_options.add_arguments(p, parse_option)
    p.add_argument(
        "--backend",
        default=None,
        metavar="URL",
        help="also show the flows this persistence backend holds (as `flowengine flows --backend`)",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port)",
    )
    p.add_argument(
        "--no-events",
        action="store_true",
        help="do not follow the event stream (inspect answers only)",
    )
    p.add_argument(
        "--board",
        default=None,
        metavar="URL",
        help="also list the jobs this jobboard holds (as `flowengine jobs --board`)",
    )
    p.add_argument("--board-name", default="flowengine", help="jobboard name")
    p.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="require this file's bearer token (its first line) and allow"
        " actions (default: $FLOWENGINE_DASHBOARD_TOKEN)",
    )
    p.add_argument(
        "--basic-auth-file",
        default=None,
        metavar="PATH",
        help="require a user:password of this file (one a line) and allow"
        " actions (default: $FLOWENGINE_DASHBOARD_BASIC_AUTH)",
    )
    p.add_argument(
        "--insecure-public",
        action="store_true",
        help="serve on a non-loopback --host without credentials (anyone who"
        " reaches it sees task arguments, results and tracebacks)",
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 for a refused backend, 1 for a broker problem."""
    from flowengine import exceptions as exc
    from flowengine.commands.errors import EXIT_REFUSED, CommandError

    broker = broker_options.broker_settings(args, "the workers are other processes")
    try:
        # The package first: without the extra it raises MissingExtra naming it.
        from flowengine.dashboard import app as app_mod
        from flowengine.dashboard import auth
        from flowengine.dashboard.actions import Actions
        from flowengine.dashboard.flows import FlowsSource
        from flowengine.dashboard.live import LiveState

        credentials = auth.load(args.token_file, args.basic_auth_file)
        _check_exposure(args.host, credentials, args.insecure_public)
        from flowengine.dashboard.jobs import JobsSource

        flows = FlowsSource(args.backend) if args.backend else None
        jobs = JobsSource(args.board, args.board_name) if args.board else None
    except (CommandError, exc.MissingExtra, exc.FlowEngineError, ValueError) as e:
        print(f"flowengine dashboard: {e}", file=sys.stderr)
        return EXIT_REFUSED
    import uvicorn

    live = LiveState(args.exchange, broker, events=not args.no_events)
    live.start()  # a broker problem is one line from main(), before anything listens
    actions = (
        Actions(args.exchange, broker, flows, secret_file=args.secret_file)
        if credentials.enabled
        else None
    )
    # Actions are logged at WARNING (seen whatever the level): who did what, and how it ended.
    config = uvicorn.Config(
        app_mod.build_app(live, flows, credentials, actions, jobs),
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    shown = f" (flows of {flows.url.safe})" if flows is not None else ""
    shown += f" (jobs of {jobs.safe_url})" if jobs is not None else ""
    shown += (
        f"; actions allowed with {credentials.describe}" if credentials.enabled else "; read-only"
    )
    threading.Thread(
        target=_announce,
        args=(server, broker_options.where(args), shown),
        daemon=True,
        name="flowengine-dashboard-announce",
    ).start()
    try:
        server.run()
    finally:
        live.stop()
    return 0


def _check_exposure(host: str, credentials: Any, insecure_public: bool) -> None:
    """CommandError for a non-loopback address without credentials (unless told it is fine)."""
    from flowengine.commands.errors import CommandError
    from flowengine.dashboard import auth

    if credentials.enabled or insecure_public or auth.is_loopback(host):
        return
    raise CommandError(
        f"refusing to serve on {host} without authentication (anyone who"
        f" reaches it would see task arguments, results and tracebacks):"
        f" give --token-file or --basic-auth-file (or"
        f" ${auth.TOKEN_ENV}), or --insecure-public to serve it anyway"
    )


def _announce(server: Any, where: str, shown: str) -> None:
    """Say where the page is once the server listens (the real port when --port 0)."""
    import time

    deadline = time.monotonic() + 30.0
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        return
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    print(f"Dashboard of {where} on http://{host}:{port}/{shown}", file=sys.stderr, flush=True)
