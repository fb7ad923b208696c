"""What ``flows resume`` and ``flows retry`` share: rebuild the flow, run it here."""

from __future__ import annotations

import argparse
from typing import Any

from flowengine.commands.errors import CommandError
from flowengine.commands.flows import lookup, views
from flowengine.persistence import run_records


def require_factory(fd: Any) -> None:
    """CommandError unless ``fd`` records the factory that rebuilds its flow."""
    if views.factory_name(fd) is None:
        raise CommandError(
            f"flow {lookup.short(fd.uuid)} {fd.name!r} records no flow factory, so it cannot"
            f" be rebuilt here (it was not started by `flowengine run --backend` or"
            f" engines.load_from_factory): load it in Python with"
            f" engines.load(flow, flow_detail=..., backend=...)"
        )


def load_engine(backend: Any, fd: Any, args: argparse.Namespace) -> Any:
    """An engine of ``args.engine`` over ``fd``, its flow rebuilt by the recorded factory.

    The current directory is importable (as for ``flowengine run``).
    Raises CommandError when the factory cannot be imported.
    """
    from flowengine import engines
    from flowengine.commands import engine_options, loading

    options = engine_options.engine_options(args)
    loading.make_cwd_importable()
    try:
        flow = engines.flow_from_detail(fd)
    except ImportError as e:
        cwd = run_records.of(fd).get("cwd")
        hint = (
            f"; it was imported from {cwd}: run from there or add it to PYTHONPATH" if cwd else ""
        )
        # flow_from_detail's own message is generic; the import error it replaced is not.
        detail = e.__context__ if isinstance(e.__context__, ImportError) else e
        raise CommandError(f"cannot rebuild flow {lookup.short(fd.uuid)}: {detail}{hint}") from e
    return engines.load(flow, flow_detail=fd, backend=backend, engine=args.engine, **options)


def run(engine: Any, args: argparse.Namespace, command: str, safe_url: str, **records: Any) -> int:
    """Record this process as the flow's owner and run it (see running.run_engine)."""
    from flowengine.commands import running

    run_records.Recorder(engine, args.engine).start(**records)
    hint = f"flowengine flows resume {lookup.short(engine.storage.flow_uuid)} --backend {safe_url}"
    return running.run_engine(engine, command, no_progress=args.no_progress, resume_hint=hint)
