"""``flowengine flows delete FLOW | --book NAME``: forget a flow or a whole logbook."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from flowengine.commands.errors import CommandError
from flowengine.commands.flows import lookup, settings

#: Exit status when the user answered no at the confirmation prompt.
EXIT_DECLINED = 1


def add_parser(sub: Any, parse_option: Any) -> argparse.ArgumentParser:
    """Add ``delete`` to the ``flows`` subcommands."""
    p: argparse.ArgumentParser = sub.add_parser(
        "delete", help="delete a flow detail, or a logbook with its flows"
    )
    p.add_argument(
        "flow",
        metavar="FLOW",
        nargs="?",
        default=None,
        help="flow detail uuid or its first characters",
    )
    p.add_argument(
        "--book",
        default=None,
        metavar="NAME",
        help="delete this logbook (name or uuid) and all its flows instead",
    )
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--force",
        action="store_true",
        help="delete even flows that are RUNNING (their engine may be alive)",
    )
    return p


def _check_not_running(fds: list[Any], force: bool) -> None:
    running = [fd for fd in fds if fd.state in settings.IN_PROGRESS_STATES]
    if running and not force:
        names = ", ".join(f"{lookup.short(fd.uuid)} {fd.name!r} ({fd.state})" for fd in running)
        raise CommandError(
            f"refusing to delete a flow that may still be running: {names};"
            " pass --force if its engine is dead"
        )


def _confirm(question: str, yes: bool) -> bool:
    """Ask on stderr, read stdin; anything but y/yes (or end of input) is a no."""
    if yes:
        return True
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print(file=sys.stderr)  # the answer was not echoed: end the prompt's line
    return answer.strip().lower() in ("y", "yes")


def run(args: argparse.Namespace, command: str) -> int:
    """Delete after confirmation; 0 deleted, 1 declined, 2 refused."""
    from flowengine.commands import backend_url
    from flowengine.commands.flows import render, views

    if (args.flow is None) == (args.book is None):
        raise CommandError("name what to delete: a FLOW or --book NAME (not both)")
    url = backend_url.parse_url(args.backend)
    with backend_url.opened(url) as backend, contextlib.closing(backend.get_connection()) as conn:
        if args.flow is not None:
            book, fd = lookup.find_flow(conn, args.flow, url.safe)
            _check_not_running([fd], args.force)
            where = f" from logbook {book.name!r}" if book is not None else ""
            what = (
                f"flow {fd.uuid} {fd.name!r} ({fd.state},"
                f" {render.counts_text(views.atom_counts(fd))}){where}"
            )
            if not _confirm(f"Delete {what}?", args.yes):
                print(f"{command}: nothing deleted", file=sys.stderr)
                return EXIT_DECLINED
            conn.destroy_flow_details(fd.uuid)
        else:
            book = lookup.find_book(conn, args.book, url.safe)
            fds = list(conn.get_flows_for_book(book.uuid, lazy=True))
            _check_not_running(fds, args.force)
            what = f"logbook {book.name!r} ({book.uuid}) and its {len(fds)} flow(s)"
            if not _confirm(f"Delete {what}?", args.yes):
                print(f"{command}: nothing deleted", file=sys.stderr)
                return EXIT_DECLINED
            conn.destroy_logbook(book.uuid)
    print(f"Deleted {what}.")
    return 0
