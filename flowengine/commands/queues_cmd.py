"""``flowengine queues`` (an exchange's queues, depths, consumers) and ``flowengine purge``.

Dead-letter queues (``<queue>.dead``, ``<exchange>.dead``) are listed as any
other, their kind saying whose dead letters they hold; ``flowengine
deadletters`` reads them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from flowengine.commands import broker_options

#: Exit statuses: the purge was declined; a refusal (no such queue).
EXIT_DECLINED = 1
EXIT_REFUSED = 2

#: Seconds ``queues`` waits for live workers to say which queues they consume.
WORKERS_TIMEOUT_S = 1.0

_WHY = "the queues belong to other processes"
_REPLY_QUEUE = re.compile(r"_[0-9a-f]{32}$")


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add ``queues`` and ``purge`` to the ``flowengine`` parser."""
    queues = sub.add_parser("queues", help="list an exchange's queues with depths and consumers")
    broker_options.add_arguments(queues, parse_option)
    queues.add_argument(
        "--queue",
        dest="queues",
        default=[],
        action="append",
        metavar="NAME",
        help="also show this queue (repeatable; RabbitMQ lists only the"
        " queues of live workers otherwise)",
    )
    queues.add_argument(
        "--timeout",
        type=float,
        default=WORKERS_TIMEOUT_S,
        metavar="SECONDS",
        help="how long live workers get to answer (default 1)",
    )
    queues.add_argument("--json", action="store_true", help="print the queues as JSON")
    purge = sub.add_parser("purge", help="remove the messages waiting in a queue")
    purge.add_argument("queue", metavar="QUEUE")
    broker_options.add_arguments(purge, parse_option)
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace) -> int:
    """Run ``queues`` or ``purge``."""
    broker = broker_options.broker_settings(args, _WHY)
    if args.command == "purge":
        return _purge(broker, args)
    return _queues(broker, args)


def _kind(name: str, exchange: str, workers: list[dict[str, Any]]) -> str:
    """What a queue is for, from its name and the live workers' answers."""
    from flowengine.engines.worker_based.messaging import dead_letters

    if dead_letters.is_dead_letter_queue(name):
        of = name[: -len(dead_letters.SUFFIX)]
        return "dead letters of private queues" if of == exchange else f"dead letters of {of}"
    for worker in workers:
        wid = worker["worker_id"]
        if name == f"{exchange}_control.{wid}":
            return f"control of {wid}"
        if name.endswith(f".{wid}"):
            return f"private to {wid}"
    topics = {t for worker in workers for t in worker.get("topics", [])}
    prefix = f"{exchange}_"
    if name.startswith(prefix) and name[len(prefix) :] in topics:
        return "topic"
    if _REPLY_QUEUE.search(name) or name.startswith(f"{prefix}control-"):
        return "engine or client replies"
    return "-"


def _queues(broker: Any, args: argparse.Namespace) -> int:
    from flowengine.engines.worker_based.messaging import dead_letters, inventory
    from flowengine.engines.worker_based.messaging.control_client import ControlClient

    with ControlClient(args.exchange, broker) as client:
        answers = client.ask("ping", timeout_s=args.timeout)
    workers = [a.result.get("worker", {}) for a in answers if a.ok]
    seen: dict[str, int] = {}
    for worker in workers:
        for queue in worker.get("queues", []):
            seen[queue] = seen.get(queue, 0) + 1
    names = set(seen) | set(args.queues)
    for worker in workers:  # a topic queue exists even while its workers are away
        names.update(f"{args.exchange}_{topic}" for topic in worker.get("topics", []))
    names.update(dead_letter_queues(args.exchange, workers, args.queues))
    found = inventory.describe_queues(broker, args.exchange, names, seen)
    rows = [
        dict(
            q.as_dict(),
            kind=_kind(q.name, args.exchange, workers),
            dead_letters=dead_letters.is_dead_letter_queue(q.name),
        )
        for q in found
    ]
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("QUEUE", "MESSAGES", "CONSUMERS", "KIND"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["name"], str(row["messages"]), str(row["consumers"]), row["kind"])
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    source = (
        "counted by the broker"
        if found and found[0].consumers_from == "broker"
        else f"live workers that answered within {args.timeout:g} s"
    )
    print(
        f"{len(rows)} queue(s) on {broker_options.where(args)}; consumers: {source}",
        file=sys.stderr,
    )
    waiting = [row for row in rows if row["dead_letters"] and row["messages"]]
    if waiting:
        print(
            f"{sum(row['messages'] for row in waiting)} dead letter(s) in"
            f" {len(waiting)} dead-letter queue(s): see flowengine deadletters list QUEUE",
            file=sys.stderr,
        )
    return 0


def dead_letter_queues(exchange: str, workers: list[dict[str, Any]], named: list[str]) -> set[str]:
    """The dead-letter queues there may be (those that exist are listed).

    The virtual transports list every queue bound to the exchange, these
    among them; RabbitMQ only those asked for by name: each topic's and
    named queue's ``<queue>.dead``, and the private queues' ``<exchange>.dead``.
    """
    from flowengine.engines.worker_based.messaging import dead_letters

    shared = {f"{exchange}_{topic}" for worker in workers for topic in worker.get("topics", [])}
    shared.update(name for name in named if not dead_letters.is_dead_letter_queue(name))
    return {
        dead_letters.dead_letter_queue_name(name, exchange, private=False) for name in shared
    } | {dead_letters.dead_letter_queue_name("", exchange, private=True)}


def _purge(broker: Any, args: argparse.Namespace) -> int:
    from flowengine.engines.worker_based.messaging import inventory

    try:
        depth = inventory.queue_depth(broker, args.exchange, args.queue)
    except inventory.QueueNotFound as e:
        print(f"flowengine purge: {e}", file=sys.stderr)
        return EXIT_REFUSED
    if not args.yes:
        print(
            f"Purge {depth} message(s) waiting in queue {args.queue!r} on"
            f" {broker_options.where(args)}? [y/N] ",
            end="",
            file=sys.stderr,
            flush=True,
        )
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("Nothing purged.", file=sys.stderr)
            return EXIT_DECLINED
    purged = inventory.purge_queue(broker, args.exchange, args.queue)
    print(f"Purged {purged} message(s) from queue {args.queue!r}.")
    return 0
