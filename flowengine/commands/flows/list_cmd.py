"""``flowengine flows list``: logbooks and their flow details, newest first."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
from typing import Any

from flowengine.commands.errors import CommandError
from flowengine.commands.flows import settings


def add_parser(sub: Any, parse_option: Any) -> argparse.ArgumentParser:
    """Add ``list`` to the ``flows`` subcommands."""
    p: argparse.ArgumentParser = sub.add_parser(
        "list", help="logbooks and their flows: state, times, atoms per state"
    )
    p.add_argument(
        "--book", default=None, metavar="NAME", help="only the logbook(s) with this name (or uuid)"
    )
    p.add_argument(
        "--state",
        dest="states",
        default=[],
        action="append",
        metavar="STATE",
        type=str.upper,
        help="only flows in this state (repeatable): " + ", ".join(settings.FLOW_STATES),
    )
    p.add_argument(
        "--json", action="store_true", help="a JSON list of logbooks, each with its flows"
    )
    return p


def run(args: argparse.Namespace, command: str) -> int:
    """List what the backend holds; 0 even when it holds nothing."""
    from flowengine.commands import backend_url
    from flowengine.commands.flows import render, views

    for state in args.states:
        if state not in settings.FLOW_STATES:
            raise CommandError(
                f"--state {state}: not a flow state (one of {', '.join(settings.FLOW_STATES)})"
            )
    url = backend_url.parse_url(args.backend)
    with backend_url.opened(url) as backend, contextlib.closing(backend.get_connection()) as conn:
        books = _select(conn, args, url.safe)
    if args.json:
        print(
            json.dumps(
                [
                    dict(views.book_view(book), flows=[views.flow_view(fd) for fd in fds])
                    for book, fds in books
                ],
                indent=2,
            )
        )
        return 0
    render.flows_table(books, url.safe)
    return 0


def _select(conn: Any, args: argparse.Namespace, safe_url: str) -> list[tuple[Any, list[Any]]]:
    """``(book, its flows newest first)`` for the books and states asked, newest first."""
    from flowengine.commands.flows import lookup, views

    if args.book is not None:
        books = lookup.find_books(conn, args.book)
        if not books:
            raise CommandError(f"no logbook named {args.book!r} in {safe_url}")
    else:
        books = list(conn.get_logbooks(lazy=True))
    selected = []
    for book in books:
        fds = list(conn.get_flows_for_book(book.uuid))
        if args.states:
            fds = [fd for fd in fds if (fd.state or "PENDING") in args.states]
            if not fds:
                continue
        selected.append((book, views.newest_first(fds)))
    oldest = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    selected.sort(key=lambda pair: (_newest_time(pair) or oldest, pair[0].name), reverse=True)
    return selected


def _newest_time(pair: tuple[Any, list[Any]]) -> datetime.datetime | None:
    """When the book (or its newest flow) was last touched."""
    from flowengine.commands.flows import views

    book, fds = pair
    candidates = [t for t in (book.updated_at, book.created_at) if t is not None]
    candidates += [t for fd in fds for t in views.times(fd) if t is not None]
    return max(candidates) if candidates else None
