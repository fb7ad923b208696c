"""``flowengine graph module:flow_factory``: draw a flow's compiled graph."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add the ``graph`` subcommand to the ``flowengine`` parser."""
    p = sub.add_parser("graph", help="draw a flow (DOT text, or SVG/PNG with Graphviz)")
    p.add_argument(
        "flow", metavar="module:flow_factory", help="a function returning a flow (or a flow object)"
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="PATH",
        help="flow.svg, flow.png (need Graphviz's dot) or flow.dot; default: DOT text on stdout",
    )


def run(args: argparse.Namespace) -> int:
    """Compile the flow and write its drawing."""
    from flowengine.commands import loading
    from flowengine.engines.action_engine import graph_draw

    try:
        flow = loading.load_flow(args.flow)
    except (ValueError, ImportError, AttributeError) as e:
        print(f"flowengine graph: {e}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(graph_draw.to_dot(flow, title=flow.name))
        return 0
    try:
        fmt = graph_draw.write(flow, args.output, title=flow.name)
    except graph_draw.GraphvizMissing as e:
        print(f"flowengine graph: {e}", file=sys.stderr)
        return 3
    except ValueError as e:
        print(f"flowengine graph: {e}", file=sys.stderr)
        return 2
    print(f"Wrote {args.output} ({fmt})", file=sys.stderr)
    return 0
