"""``flowengine run module:flow_factory``: run a flow here with a progress bar.

With ``--backend URL`` the run is persisted in logbook ``--book`` (created
if missing) with its factory recorded, so ``flowengine flows resume`` can
rebuild and carry on the flow if this process dies.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

#: Command name in messages.
COMMAND = "flowengine run"


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add the ``run`` subcommand to the ``flowengine`` parser."""
    from flowengine.commands import backend_url, engine_options

    p = sub.add_parser("run", help="run a flow with a progress bar and print its results")
    p.add_argument(
        "flow", metavar="module:flow_factory", help="a function returning a flow (or a flow object)"
    )
    p.add_argument(
        "--store",
        dest="store",
        default=[],
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="initial value (repeatable; parsed as JSON)",
    )
    p.add_argument(
        "--store-json", default=None, metavar="JSON", help="initial values as one JSON object"
    )
    engine_options.add_arguments(p, parse_option)
    p.add_argument(
        "--graph",
        default=None,
        metavar="PATH",
        help="after the run, draw the flow coloured by atom state",
    )
    p.add_argument(
        "--backend",
        default=None,
        metavar="URL",
        help="persist the run: dir:PATH, sqlite:///PATH or postgresql://..."
        f" (default: ${backend_url.BACKEND_ENV}; none: not persisted)",
    )
    p.add_argument(
        "--book",
        default=None,
        metavar="NAME",
        help="logbook to save the flow in, created if missing (name or uuid;"
        " default: the flow's name)",
    )


def run(args: argparse.Namespace) -> int:
    """Load, run and report; 1 when the flow fails, 2 when refused."""
    from flowengine import engines
    from flowengine import exceptions as exc
    from flowengine.commands import backend_url, engine_options, loading, running
    from flowengine.commands.errors import EXIT_REFUSED, CommandError

    try:
        factory, flow = loading.load_factory(args.flow)
        store = dict(args.store)
        if args.store_json:
            store.update(json.loads(args.store_json))
        if factory is not None:
            flow = factory()
    except (ValueError, ImportError, AttributeError) as e:
        print(f"{COMMAND}: {e}", file=sys.stderr)
        return 2
    options = engine_options.engine_options(args)
    try:
        if args.backend or os.environ.get(backend_url.BACKEND_ENV):
            url = backend_url.parse_url(args.backend)
            with backend_url.opened(url, create=True) as backend:
                engine = _persisted_engine(flow, factory, store, backend, args, url, options)
                hint = f"flowengine flows resume {_short(engine)} --backend {url.safe}"
                return running.run_engine(
                    engine,
                    COMMAND,
                    no_progress=args.no_progress,
                    graph=args.graph,
                    resume_hint=hint,
                )
        if args.book is not None:
            raise CommandError(
                f"--book needs a backend: --backend URL or ${backend_url.BACKEND_ENV}"
            )
    except (CommandError, exc.MissingExtra) as e:
        print(f"{COMMAND}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    engine = engines.load(flow, store=store, engine=args.engine, **options)
    return running.run_engine(engine, COMMAND, no_progress=args.no_progress, graph=args.graph)


def _short(engine: Any) -> str:
    from flowengine.commands.flows import lookup

    return lookup.short(engine.storage.flow_uuid)


def _persisted_engine(
    flow: Any,
    factory: Any,
    store: dict[str, Any],
    backend: Any,
    args: argparse.Namespace,
    url: Any,
    options: dict[str, Any],
) -> Any:
    """An engine over a new flow detail in the logbook ``args.book``, factory recorded."""
    from flowengine import engines
    from flowengine.commands.flows import lookup
    from flowengine.persistence import run_records
    from flowengine.utils import persistence_utils as p_utils

    book = lookup.book_to_fill(backend, args.book or flow.name)
    records = {"created_at": run_records.now(), "cwd": os.getcwd()}
    fd = p_utils.create_flow_detail(
        flow, book=book, backend=backend, meta={run_records.META_KEY: records}
    )
    if factory is not None:
        try:
            engines.save_factory_details(fd, factory, [], {}, backend=backend)
        except (ValueError, ImportError) as e:
            print(
                f"{COMMAND}: warning: `flows resume` will not be able to rebuild this flow: {e}",
                file=sys.stderr,
            )
    else:
        print(
            f"{COMMAND}: warning: {args.flow} is a flow object, not a factory:"
            f" `flows resume` will not be able to rebuild it",
            file=sys.stderr,
        )
    engine = engines.load(
        flow, store=store, flow_detail=fd, backend=backend, engine=args.engine, **options
    )
    run_records.Recorder(engine, args.engine).start()
    print(
        f"{COMMAND}: flow {fd.uuid} in logbook {book.name!r} of {url.safe}",
        file=sys.stderr,
        flush=True,
    )
    return engine
