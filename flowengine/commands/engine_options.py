"""Engine options shared by the commands that run flows (run, flows resume, flows retry)."""

from __future__ import annotations

import argparse
from typing import Any

#: Engine names accepted by --engine (the entry points of flowengine.engines).
ENGINES = ("serial", "parallel", "worker-based")


def add_arguments(p: argparse.ArgumentParser, parse_option: Any) -> None:
    """Add --engine and the worker-based engine's broker options to ``p``."""
    p.add_argument("--engine", default="serial", choices=ENGINES)
    p.add_argument(
        "--url",
        default=None,
        help="broker URL (worker-based engine; default: $FLOWENGINE_BROKER_URL)",
    )
    p.add_argument("--exchange", default=None, help="exchange (worker-based engine)")
    p.add_argument(
        "--topic",
        dest="topics",
        default=[],
        action="append",
        help="worker topic (repeatable; worker-based engine)",
    )
    p.add_argument("--transport", default=None, help="kombu transport name")
    p.add_argument(
        "--transport-option",
        dest="transport_options",
        default=[],
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="transport option (repeatable; values parsed as JSON)",
    )
    p.add_argument(
        "--durable",
        action="store_true",
        help="the workers run with --durable (durable exchange and queues,"
        " persistent messages; worker-based engine)",
    )
    p.add_argument(
        "--queue-type",
        default=None,
        choices=["classic", "quorum"],
        help="the workers run with --queue-type (quorum: RabbitMQ quorum"
        " queues, with --durable; worker-based engine)",
    )
    p.add_argument(
        "--failover-strategy",
        default=None,
        choices=["round-robin", "shuffle"],
        help="order in which the URLs of a failover list (--url"
        " 'amqp://h1//;amqp://h2//') are tried (worker-based engine)",
    )
    p.add_argument(
        "--transition-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail a remote task no worker takes within this many seconds"
        " (worker-based engine; default 60)",
    )
    p.add_argument(
        "--events", action="store_true", help="publish flow events (worker-based engine)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options ``engines.load`` takes for ``args.engine`` (none for local engines).

    Raises BrokerConfigError for a memory broker: the workers are other processes.
    """
    if args.engine != "worker-based":
        return {}
    from flowengine.engines.worker_based.transports import errors as broker_errors

    broker_errors.check_shared(args.url, args.transport, "the workers are other processes")
    options: dict[str, Any] = {
        "url": args.url,
        "exchange": args.exchange,
        "topics": list(args.topics),
        "transport": args.transport,
        "events": args.events,
        # A task's failure is reported by name,
        # as on the local engines.
        "remote_exceptions": "original",
        "transition_timeout": args.transition_timeout,
        "durable": args.durable or None,
        "queue_type": args.queue_type,
        "failover_strategy": args.failover_strategy,
    }
    if args.transport_options:
        options["transport_options"] = dict(args.transport_options)
    return {k: v for k, v in options.items() if v not in (None, [])}
