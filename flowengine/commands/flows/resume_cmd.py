"""``flowengine flows resume FLOW``: carry on a flow whose engine died or was suspended.

Atoms that finished keep their results and do not run again; one that was
running when its engine died runs again (as on any TaskFlow resumption).
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from flowengine import states as st
from flowengine.commands.errors import CommandError
from flowengine.commands.flows import settings


def add_parser(sub: Any, parse_option: Any) -> argparse.ArgumentParser:
    """Add ``resume`` to the ``flows`` subcommands."""
    p: argparse.ArgumentParser = sub.add_parser(
        "resume", help="resume a flow left RUNNING or SUSPENDED (finished atoms do not run again)"
    )
    p.add_argument("flow", metavar="FLOW", help="flow detail uuid or its first characters")
    p.add_argument(
        "--force",
        action="store_true",
        help="resume a RUNNING flow even when its engine may still be alive"
        " (another host, or no owner recorded)",
    )
    from flowengine.commands import engine_options

    engine_options.add_arguments(p, parse_option)
    return p


def check_resumable(fd: Any, force: bool) -> None:
    """CommandError unless ``fd`` can be resumed by this process now."""
    from flowengine.commands.flows import lookup, rerun
    from flowengine.persistence import process_owner, run_records

    name = f"flow {lookup.short(fd.uuid)} {fd.name!r}"
    state = fd.state or st.PENDING
    if state == st.SUCCESS:
        raise CommandError(f"{name} is already SUCCESS: nothing to resume")
    if state in (st.FAILURE, st.REVERTED):
        raise CommandError(
            f"{name} ended {state}: `flowengine flows retry {lookup.short(fd.uuid)}` runs it again"
        )
    rerun.require_factory(fd)
    if state not in settings.IN_PROGRESS_STATES or force:
        return
    recorded = run_records.of(fd).get("owner")
    if not isinstance(recorded, dict):
        raise CommandError(
            f"{name} is {state} and records no engine process (it was not"
            f" started by `flowengine run`): pass --force if no engine"
            f" runs it any more"
        )
    alive = process_owner.is_alive(recorded)
    if alive:
        raise CommandError(
            f"{name} is {state} in {process_owner.describe(recorded)}, which is"
            f" still alive: stop it first (a first SIGTERM suspends it)"
        )
    if alive is None:
        raise CommandError(
            f"{name} is {state} in {process_owner.describe(recorded)}; this host"
            f" cannot tell whether it still runs: pass --force if it"
            f" does not"
        )


def run(args: argparse.Namespace, command: str) -> int:
    """Resume the flow here; the exit status is the run's (0, 1 failed, 130 suspended)."""
    from flowengine.commands import backend_url
    from flowengine.commands.flows import lookup, rerun

    url = backend_url.parse_url(args.backend)
    with backend_url.opened(url) as backend:
        with contextlib.closing(backend.get_connection()) as conn:
            _book, fd = lookup.find_flow(conn, args.flow, url.safe)
        check_resumable(fd, args.force)
        engine = rerun.load_engine(backend, fd, args)
        return rerun.run(engine, args, command, url.safe)
