"""``flowengine flows show FLOW``: one flow detail, atom by atom."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from flowengine.commands.flows import settings


def add_parser(sub: Any, parse_option: Any) -> argparse.ArgumentParser:
    """Add ``show`` to the ``flows`` subcommands."""
    p: argparse.ArgumentParser = sub.add_parser(
        "show",
        help="a flow's atoms in order: state, intention, result,"
        " failure with traceback, retry history",
    )
    p.add_argument("flow", metavar="FLOW", help="flow detail uuid or its first characters")
    p.add_argument(
        "--full",
        action="store_true",
        help=f"whole results (default: cut to {settings.RESULT_SUMMARY_CHARS} characters)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="everything stored, as one JSON object (results always whole)",
    )
    p.add_argument(
        "--show-secrets",
        action="store_true",
        help="show injected values whose names look secret (password, token,"
        " key...; masked as *** by default, as in job details)",
    )
    return p


def run(args: argparse.Namespace, command: str) -> int:
    """Print the flow detail; CommandError if the flow is unknown or ambiguous."""
    from flowengine.commands import backend_url
    from flowengine.commands.flows import lookup, render, views

    url = backend_url.parse_url(args.backend)
    with backend_url.opened(url) as backend, contextlib.closing(backend.get_connection()) as conn:
        book, fd = lookup.find_flow(conn, args.flow, url.safe)
    if args.json:
        view = views.show_view(book, fd, args.show_secrets)
        print(json.dumps(view, indent=2, ensure_ascii=False))
    else:
        render.show(book, fd, args.full, args.show_secrets)
    return 0
