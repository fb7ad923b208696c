"""``flowengine run module:flow_factory``: run a flow here with a progress bar."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: Command name in messages.
COMMAND = "flowengine run"


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add the ``run`` subcommand to the ``flowengine`` parser."""
    from flowengine.commands import engine_options

    p = sub.add_parser("run", help="run a flow with a progress bar and print its results")
    p.add_argument("flow", metavar="module:flow_factory",
                   help="a function returning a flow (or a flow object)")
    p.add_argument("--store", dest="store", default=[], action="append", type=parse_option,
                   metavar="KEY=VALUE", help="initial value (repeatable; parsed as JSON)")
    p.add_argument("--store-json", default=None, metavar="JSON",
                   help="initial values as one JSON object")
    engine_options.add_arguments(p, parse_option)
    p.add_argument("--graph", default=None, metavar="PATH",
                   help="after the run, draw the flow coloured by atom state")


def run(args: argparse.Namespace) -> int:
    """Load, run and report; 1 when the flow fails."""
    from flowengine import engines
    from flowengine.commands import engine_options, loading, running

    try:
        flow = loading.load_flow(args.flow)
        store = dict(args.store)
        if args.store_json:
            store.update(json.loads(args.store_json))
    except (ValueError, ImportError, AttributeError) as e:
        print(f"{COMMAND}: {e}", file=sys.stderr)
        return 2
    options = engine_options.engine_options(args)
    engine = engines.load(flow, store=store, engine=args.engine, **options)
    return running.run_engine(engine, COMMAND, no_progress=args.no_progress, graph=args.graph)
