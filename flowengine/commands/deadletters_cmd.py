"""``flowengine deadletters list|show|requeue QUEUE``: read refused messages, put them back.

A dead-letter queue (``<queue>.dead``, ``<exchange>.dead``; see
``flowengine queues``) holds what consume loops refused, each with why and
where it came from. ``list`` shows one line per dead letter, ``show`` one
whole, ``requeue`` publishes chosen ones again where they were first
published (once the cause is fixed) and removes them. Reading loses
nothing and leaves the queue as it was (see
:mod:`flowengine.engines.worker_based.messaging.dead_letter_reader`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flowengine.commands import broker_options

#: Exit statuses: requeue declined, or some dead letters chosen were kept; a refusal.
EXIT_DECLINED = 1
EXIT_REFUSED = 2

_WHY = "the dead-letter queues belong to other processes"


def _index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an index (1 is the oldest)")
    return value


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add ``deadletters`` and its subcommands to the ``flowengine`` parser."""
    p = sub.add_parser("deadletters", help="read the messages consume loops refused; requeue them")
    commands = p.add_subparsers(dest="deadletters_command", required=True)

    def common(name: str, help_text: str) -> argparse.ArgumentParser:
        q: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
        q.add_argument("queue", metavar="QUEUE", help="a dead-letter queue (<queue>.dead)")
        broker_options.add_arguments(q, parse_option)
        return q

    listing = common("list", "one line per dead letter: when, what, why, from where")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    show = common("show", "one dead letter: reason, origin, properties, headers, body")
    show.add_argument(
        "--index",
        type=_index,
        default=1,
        metavar="N",
        help="which one, as 'list' numbers them (default 1, the oldest)",
    )
    show.add_argument("--json", action="store_true", help="print it as JSON (whole body in base64)")
    requeue = common("requeue", "publish dead letters again where they were first published")
    which = requeue.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--index",
        dest="indexes",
        type=_index,
        action="append",
        metavar="N",
        help="this one, as 'list' numbers them (repeatable)",
    )
    which.add_argument("--all", action="store_true", help="every one")
    requeue.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace) -> int:
    """Run ``deadletters list``, ``show`` or ``requeue``."""
    from flowengine.engines.worker_based.messaging import dead_letter_reader as dlr
    from flowengine.engines.worker_based.messaging import inventory

    broker = broker_options.broker_settings(args, _WHY)
    run_sub = {"list": _list, "show": _show, "requeue": _requeue}[args.deadletters_command]
    try:
        dlr.check_name(args.queue)
        return run_sub(broker, args)
    except (dlr.NotADeadLetterQueue, inventory.QueueNotFound) as e:
        print(f"flowengine deadletters: {e}", file=sys.stderr)
        return EXIT_REFUSED


def _list(broker: Any, args: argparse.Namespace) -> int:
    from flowengine.engines.worker_based.messaging import dead_letter_reader as dlr

    letters = dlr.read_dead_letters(broker, args.exchange, args.queue)
    if args.json:
        print(
            json.dumps([letter.as_dict(body=False) for letter in letters], indent=2, sort_keys=True)
        )
    elif letters:
        rows = [("#", "REFUSED AT (UTC)", "TYPE", "CORRELATION ID", "FROM QUEUE", "REASON")]
        rows += [
            (
                str(letter.index),
                letter.refused_at_text,
                _cell(letter.type),
                _cell(letter.correlation_id),
                _cell(letter.queue),
                _cell(letter.reason),
            )
            for letter in letters
        ]
        widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]) - 1)]
        for row in rows:
            print("  ".join([cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]))
    print(
        f"{len(letters)} dead letter(s) in queue {args.queue!r} on {broker_options.where(args)}",
        file=sys.stderr,
    )
    return 0


def _show(broker: Any, args: argparse.Namespace) -> int:
    from flowengine.engines.worker_based.messaging import dead_letter_reader as dlr

    letters = dlr.read_dead_letters(broker, args.exchange, args.queue, limit=args.index)
    if len(letters) < args.index:
        print(
            f"flowengine deadletters: no dead letter {args.index} in queue {args.queue!r}"
            f" (it holds {len(letters)})",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    letter = letters[args.index - 1]
    if args.json:
        print(
            json.dumps(
                dict(letter.as_dict(), dead_letter_queue=args.queue), indent=2, sort_keys=True
            )
        )
        return 0
    where = (
        f"exchange {letter.exchange!r}, routing key {letter.routing_key!r}"
        if letter.exchange is not None
        else "-"
    )
    print(f"Dead letter {letter.index} in queue {args.queue!r}")
    print(f"  reason:       {_cell(letter.reason)}")
    print(f"  refused at:   {letter.refused_at_text} UTC by {_cell(letter.refused_by)}")
    print(f"  from queue:   {_cell(letter.queue)}")
    print(f"  published to: {where}")
    print("  properties:")
    for name, value in sorted(letter.properties.items()):
        print(f"    {name}: {json.dumps(value)}")
    print("  headers:" + ("" if letter.headers or letter.odd_headers is not None else " (none)"))
    for name, value in sorted(letter.headers.items()):
        print(f"    {name}: {json.dumps(value, default=repr)}")
    if letter.odd_headers is not None:
        print(f"    (not a mapping) {json.dumps(letter.odd_headers, default=repr)}")
    cut = (
        f", cut from {letter.truncated} bytes when dead-lettered"
        if letter.truncated is not None
        else ""
    )
    print(f"  body:         {len(letter.body)} bytes{cut}")
    for line in letter.body_excerpt().splitlines() or [""]:
        print(f"    {line}")
    return 0


def check_requeue(broker: Any, exchange: str, queue: str, indexes: list[int] | None) -> int:
    """How many dead letters a requeue of ``indexes`` (None: all) moves; CommandError if absent."""
    from flowengine.commands.errors import CommandError
    from flowengine.engines.worker_based.messaging import inventory

    depth = inventory.queue_depth(broker, exchange, queue)
    if indexes is not None and indexes and max(indexes) > depth:
        raise CommandError(
            f"no dead letter {max(indexes)} in queue {queue!r} (it holds {depth}); nothing requeued"
        )
    return depth if indexes is None else len(indexes)


def requeue(
    broker: Any, exchange: str, queue: str, indexes: list[int] | None
) -> tuple[list[str], list[str], bool]:
    """Requeue dead letters ``indexes`` (None: all) of ``queue`` (``deadletters``, the dashboard).

    Returns what was done (lines), what went wrong (lines) and whether all
    chosen were requeued.
    """
    from flowengine.engines.worker_based.messaging import dead_letter_reader as dlr

    report = dlr.requeue_dead_letters(broker, exchange, queue, indexes)
    done_lines = [
        f"Requeued dead letter {letter.index} ({_cell(letter.type)}"
        f" {_cell(letter.correlation_id)}) to exchange {letter.exchange!r},"
        f" routing key {letter.routing_key!r}"
        for letter in report.requeued + report.already_gone
    ]
    problems = [
        f"Dead letter {letter.index} had left queue {queue!r} meanwhile (another"
        f" reader?): it may have been requeued twice"
        for letter in report.already_gone
    ]
    problems += [f"Kept dead letter {letter.index}: {why}" for letter, why in report.kept]
    problems += [f"No dead letter {index} any more in queue {queue!r}" for index in report.missing]
    done = len(report.requeued) + len(report.already_gone)
    done_lines.append(f"Requeued {done} dead letter(s) from queue {queue!r}.")
    return done_lines, problems, not (report.kept or report.missing)


def _requeue(broker: Any, args: argparse.Namespace) -> int:
    from flowengine.commands.errors import CommandError

    indexes = None if args.all else sorted(set(args.indexes))
    try:
        count = check_requeue(broker, args.exchange, args.queue, indexes)
    except CommandError as e:
        print(f"flowengine deadletters: {e}", file=sys.stderr)
        return EXIT_REFUSED
    if count == 0:
        print(f"No dead letters in queue {args.queue!r}: nothing requeued.", file=sys.stderr)
        return 0
    if not args.yes:
        print(
            f"Requeue {count} dead letter(s) of queue {args.queue!r} on"
            f" {broker_options.where(args)} where they were first published? [y/N] ",
            end="",
            file=sys.stderr,
            flush=True,
        )
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            print("Nothing requeued.", file=sys.stderr)
            return EXIT_DECLINED
    done_lines, problems, complete = requeue(broker, args.exchange, args.queue, indexes)
    for line in done_lines[:-1]:
        print(line)
    for line in problems:
        print(line, file=sys.stderr)
    print(done_lines[-1])
    return 0 if complete else EXIT_DECLINED


def _cell(value: Any) -> str:
    """A value in a line of text: as is when a string, else its JSON; ``-`` for None."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return " ".join(text.split())
