"""``flowengine flows list|show|resume|retry|delete``: persisted flows from the command line.

One module per subcommand, each with ``add_parser(sub, parse_option)`` and
``run(args, command)``; this module adds the shared options (``--backend``,
``-v``) and turns refusals into one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any

from flowengine.commands.flows import delete_cmd, list_cmd, resume_cmd, retry_cmd, show_cmd

#: Subcommand name -> module.
SUBCOMMANDS = {
    "list": list_cmd,
    "show": show_cmd,
    "resume": resume_cmd,
    "retry": retry_cmd,
    "delete": delete_cmd,
}


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add ``flows`` and its subcommands to the ``flowengine`` parser."""
    from flowengine.commands import backend_url

    p = sub.add_parser("flows", help="list, show, resume, retry or delete persisted flows")
    flows_sub = p.add_subparsers(
        dest="flows_command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}"
    )
    for module in SUBCOMMANDS.values():
        sp = module.add_parser(flows_sub, parse_option)
        sp.add_argument(
            "--backend",
            default=None,
            metavar="URL",
            help="dir:PATH, sqlite:///PATH or postgresql://USER@HOST/DB"
            f" (default: ${backend_url.BACKEND_ENV})",
        )
        sp.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="log at DEBUG level",
        )


def run(args: argparse.Namespace) -> int:
    """Run ``flows <subcommand>``; a refusal or a storage problem is one line on stderr."""
    from flowengine import exceptions as exc
    from flowengine.commands.errors import EXIT_REFUSED, CommandError

    command = f"flowengine flows {args.flows_command}"
    try:
        status: int = SUBCOMMANDS[args.flows_command].run(args, command)
        return status
    except (CommandError, exc.MissingExtra) as e:
        _say(args, command, e)
        return EXIT_REFUSED
    except exc.FlowEngineError as e:
        # The backend or the broker failed (unreachable, damaged data...): one
        # line naming it, under this subcommand's name.
        _say(args, command, e)
        return 1


def _say(args: argparse.Namespace, command: str, error: BaseException) -> None:
    if getattr(args, "verbose", False):
        traceback.print_exc()
    lines = str(error).strip().splitlines()
    print(f"{command}: {lines[0] if lines else type(error).__name__}", file=sys.stderr)
