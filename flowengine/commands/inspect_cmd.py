"""``flowengine inspect`` and ``flowengine control``: ask live workers, or tell them.

Both broadcast a CONTROL request on the workers' exchange and print the
answers that arrive within ``--timeout`` (see
:mod:`flowengine.engines.worker_based.wire.control`): a table by default,
the answers as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from flowengine.commands import broker_options

#: Exit statuses: no worker answered; a refused argument (unknown or ambiguous worker).
EXIT_NO_ANSWER = 1
EXIT_REFUSED = 2

#: Why memory:// cannot work for these commands.
_WHY = "the workers are other processes"


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add ``inspect`` and ``control`` to the ``flowengine`` parser."""
    from flowengine.engines.worker_based.wire import control as wc

    inspect = sub.add_parser("inspect", help="ask live workers what they do")
    inspect.add_argument(
        "what",
        choices=list(wc.INSPECT_COMMANDS),
        help="ping: who is there; active: running requests; reserved:"
        " requests taken, waiting for a thread; stats: counters;"
        " registered: tasks",
    )
    _common(inspect, parse_option)
    control = sub.add_parser("control", help="cancel a request, or shut a worker down")
    actions = control.add_subparsers(dest="action", required=True)
    cancel = actions.add_parser("cancel", help="cancel a request wherever it is held")
    cancel.add_argument("request", metavar="REQUEST_UUID")
    _common(cancel, parse_option)
    shutdown = actions.add_parser("shutdown", help="warm shutdown of one worker")
    shutdown.add_argument(
        "worker",
        metavar="WORKER",
        help="worker id (as `inspect ping` shows it) or its first characters",
    )
    _common(shutdown, parse_option)


def _common(p: argparse.ArgumentParser, parse_option: Any) -> None:
    broker_options.add_arguments(p, parse_option)
    p.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how long to wait for answers (default 1)",
    )
    p.add_argument(
        "--limit", type=int, default=None, metavar="N", help="stop waiting once N workers answered"
    )
    p.add_argument("--json", action="store_true", help="print the answers as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``inspect`` or ``control``; 0, 1 (no worker answered) or 2 (refused)."""
    from flowengine.commands import known_workers
    from flowengine.engines.worker_based.messaging.control_client import ControlClient

    broker = broker_options.broker_settings(args, _WHY)
    with ControlClient(args.exchange, broker) as client:
        args.expect = known_workers.load(broker.public_uri, args.exchange)
        try:
            if args.command == "inspect":
                return _inspect(client, args)
            if args.action == "cancel":
                return _cancel(client, args)
            return _shutdown(client, args)
        finally:
            if client.last_answered is not None and client.last_answered != args.expect:
                known_workers.save(broker.public_uri, args.exchange, client.last_answered)


def _answers(replies: Sequence[Any]) -> list[dict[str, Any]]:
    return sorted((r.to_dict() for r in replies), key=lambda r: r["worker_id"])


def _none_answered(args: argparse.Namespace) -> int:
    print(
        f"flowengine {args.command}: no worker answered within {args.timeout:g} s on"
        f" {broker_options.where(args)}: no flowengine worker runs there, or the"
        f" URL/exchange differ from the workers'",
        file=sys.stderr,
    )
    return EXIT_NO_ANSWER


def _inspect(client: Any, args: argparse.Namespace) -> int:
    from flowengine.commands import inspect_render

    answers = _answers(
        client.ask(args.what, timeout_s=args.timeout, limit=args.limit, expect=args.expect)
    )
    if args.json:
        print(json.dumps(answers, indent=2, sort_keys=True))
    elif answers:
        inspect_render.print_answers(args.what, answers)
    if not answers:
        return _none_answered(args)
    print(f"{len(answers)} worker(s) answered", file=sys.stderr)
    return 0


def cancel_request(
    client: Any, request: str, timeout_s: float, limit: int | None = None, expect: Any = None
) -> list[dict[str, Any]]:
    """Ask every worker to cancel ``request``; their answers (``control cancel``, the dashboard)."""
    return _answers(
        client.ask("cancel", {"request": request}, timeout_s=timeout_s, limit=limit, expect=expect)
    )


def _cancel(client: Any, args: argparse.Namespace) -> int:
    answers = cancel_request(client, args.request, args.timeout, args.limit, args.expect)
    if args.json:
        print(json.dumps(answers, indent=2, sort_keys=True))
    if not answers:
        return _none_answered(args)
    if not args.json:
        print(describe_cancel(args.request, answers))
    return 0


def describe_cancel(request: str, answers: Sequence[dict[str, Any]]) -> str:
    """One line per worker holding ``request`` (or one saying nobody does)."""
    lines = []
    for answer in answers:
        found = answer.get("result", {}).get("cancel", {})
        if not answer["ok"] or not found.get("held"):
            continue
        states = found.get("states", [])
        if found.get("process_killed"):
            what = "running: its process was killed"
        elif "running" in states:
            what = "running: its task sees the cancellation flag"
        else:
            what = "queued: dropped before it starts"
        lines.append(
            f"Request {request}: cancelled on worker {answer['worker_id']} ({what});"
            f" its engine gets a RequestCancelled failure"
        )
    if not lines:
        keep = max(
            (a.get("result", {}).get("cancel", {}).get("remembered_s", 0) for a in answers),
            default=0,
        )
        lines.append(
            f"Request {request} is held by none of the {len(answers)} worker(s)"
            f" that answered; they drop it unrun if it reaches them within"
            f" {keep:g} s"
        )
    return "\n".join(lines)


def pick_worker(client: Any, ref: str, timeout_s: float, expect: Any = None) -> str:
    """The one live worker whose id is ``ref`` or starts with it; CommandError otherwise."""
    from flowengine.commands.errors import CommandError

    pongs = _answers(client.ask("ping", timeout_s=timeout_s, expect=expect))
    matches = [
        a["worker_id"] for a in pongs if a["worker_id"] == ref or a["worker_id"].startswith(ref)
    ]
    exact = [m for m in matches if m == ref]
    if exact:
        matches = exact
    if len(matches) != 1:
        known = ", ".join(a["worker_id"] for a in pongs) or "none answered"
        what = "no live worker" if not matches else f"{len(matches)} workers"
        raise CommandError(f"{what} match {ref!r} (workers: {known})")
    return str(matches[0])


def shutdown_worker(client: Any, worker_id: str, timeout_s: float) -> list[dict[str, Any]]:
    """Tell ``worker_id`` to shut down warmly; its answer (empty if it gave none)."""
    return _answers(client.ask("shutdown", destination=[worker_id], timeout_s=timeout_s))


def describe_shutdown(worker_id: str, answers: Sequence[dict[str, Any]]) -> str:
    """What the worker now does, in one line."""
    held = answers[0]["result"]["worker"].get("held", 0)
    return (
        f"Worker {worker_id}: warm shutdown started: no new requests; it finishes"
        f" the {held} request(s) it holds, then exits"
    )


def _shutdown(client: Any, args: argparse.Namespace) -> int:
    from flowengine.commands.errors import CommandError

    try:
        worker_id = pick_worker(client, args.worker, args.timeout, args.expect)
    except CommandError as e:
        print(f"flowengine control: {e}", file=sys.stderr)
        return EXIT_REFUSED
    answers = shutdown_worker(client, worker_id, args.timeout)
    if args.json:
        print(json.dumps(answers, indent=2, sort_keys=True))
    if not answers:
        return _none_answered(args)
    if not args.json:
        print(describe_shutdown(worker_id, answers))
    return 0
