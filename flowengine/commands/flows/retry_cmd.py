"""``flowengine flows retry FLOW``: run a FAILURE or REVERTED flow again, from the start.

TaskFlow's engine, asked to run a flow detail saved as REVERTED, first
resets it: every atom back to PENDING with intention EXECUTE (results and
failures dropped, a retry's history cleared; injected values kept), the
flow back to PENDING; then the whole flow runs again. ``retry`` does
exactly that: for REVERTED the engine resets the flow itself; for FAILURE
(its revert failed too), where TaskFlow's engine would only raise the
stored failures again, ``retry`` applies the same reset through the
engine's storage first. What the discarded attempt ended with (its state
and each failure) is kept in the flow detail's metadata, for ``flows show``.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from flowengine import states as st
from flowengine.commands.errors import CommandError


def add_parser(sub: Any, parse_option: Any) -> argparse.ArgumentParser:
    """Add ``retry`` to the ``flows`` subcommands."""
    p: argparse.ArgumentParser = sub.add_parser(
        "retry", help="run a FAILURE or REVERTED flow again from the start"
    )
    p.add_argument("flow", metavar="FLOW", help="flow detail uuid or its first characters")
    from flowengine.commands import engine_options

    engine_options.add_arguments(p, parse_option)
    return p


def check_retriable(fd: Any) -> None:
    """CommandError unless ``fd`` ended FAILURE or REVERTED and records its factory."""
    from flowengine.commands.flows import lookup, rerun

    state = fd.state or st.PENDING
    name = f"flow {lookup.short(fd.uuid)} {fd.name!r}"
    if state == st.SUCCESS:
        raise CommandError(f"{name} is already SUCCESS: nothing to retry")
    if state not in (st.FAILURE, st.REVERTED):
        raise CommandError(
            f"{name} is {state}, it has not ended: `flowengine flows resume"
            f" {lookup.short(fd.uuid)}` carries it on"
        )
    rerun.require_factory(fd)


def discarded_attempt(fd: Any) -> dict[str, Any]:
    """What the attempt a retry discards ended with: time, state, failure per atom."""
    from flowengine.commands.flows import views
    from flowengine.persistence import run_records

    failures: dict[str, str] = {}
    for ad in views.atoms_in_order(fd):
        for failure in (ad.failure, ad.revert_failure):
            if failure is not None:
                kind = next(iter(failure), "Exception")
                failures.setdefault(ad.name, f"{kind}: {failure.exception_str}")
    return {"at": run_records.now(), "state": fd.state, "failures": failures}


def reset(engine: Any) -> None:
    """Every atom PENDING/EXECUTE and the flow PENDING, as TaskFlow's engine does for REVERTED."""
    engine.compile()
    engine.prepare()  # a REVERTED flow detail is reset here, by the engine itself
    storage = engine.storage
    if storage.get_flow_state() == st.PENDING:
        return
    for name in engine.compilation.atoms:
        storage.reset(name, state=st.PENDING)
        storage.set_atom_intention(name, st.EXECUTE)
    storage.set_flow_state(st.PENDING)


def run(args: argparse.Namespace, command: str) -> int:
    """Reset the flow and run it here; the exit status is the run's."""
    from flowengine.commands import backend_url
    from flowengine.commands.flows import lookup, rerun
    from flowengine.persistence import run_records

    url = backend_url.parse_url(args.backend)
    with backend_url.opened(url) as backend:
        with contextlib.closing(backend.get_connection()) as conn:
            _book, fd = lookup.find_flow(conn, args.flow, url.safe)
        check_retriable(fd)
        attempt = discarded_attempt(fd)
        retries = list(run_records.of(fd).get("retries") or []) + [attempt]
        engine = rerun.load_engine(backend, fd, args)  # the factory imports: then reset
        reset(engine)
        return rerun.run(engine, args, command, url.safe, retries=retries)
