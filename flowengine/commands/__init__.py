"""Subcommands of ``flowengine`` beyond worker/demo: events, flows, graph, run, conductor,
jobs, inspect, control, queues, purge, deadletters, dashboard."""

from __future__ import annotations

import argparse
from typing import Any

from flowengine.commands import (
    conductor_cmd,
    dashboard_cmd,
    deadletters_cmd,
    events_view,
    flows,
    graph_cmd,
    inspect_cmd,
    jobs_cmd,
    queues_cmd,
    run_flow,
)

#: Subcommand name -> module with add_parser(sub, parse_option) and run(args).
COMMANDS = {
    "events": events_view,
    "flows": flows,
    "graph": graph_cmd,
    "run": run_flow,
    "conductor": conductor_cmd,
    "jobs": jobs_cmd,
    "inspect": inspect_cmd,
    "control": inspect_cmd,
    "queues": queues_cmd,
    "purge": queues_cmd,
    "deadletters": deadletters_cmd,
    "dashboard": dashboard_cmd,
}


def add_parsers(sub: Any, parse_option: Any) -> None:
    """Add every subcommand here to the ``flowengine`` parser's subparsers."""
    for module in dict.fromkeys(COMMANDS.values()):  # a module may add several
        module.add_parser(sub, parse_option)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand ``args.command``; returns the exit code."""
    code: int = COMMANDS[args.command].run(args)
    return code
