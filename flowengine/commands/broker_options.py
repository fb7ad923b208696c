"""Broker options of the commands that talk to live workers (inspect, control, queues...)."""

from __future__ import annotations

import argparse
from typing import Any

#: The worker-based engine's default exchange, which these commands ask unless told.
DEFAULT_EXCHANGE = "default"


def add_arguments(p: argparse.ArgumentParser, parse_option: Any) -> None:
    """Add --url, --exchange, --transport(-option), --secret-file, --durable, --compat."""
    p.add_argument(
        "--url",
        default=None,
        help="broker URL (redis://..., amqp://...; default: $FLOWENGINE_BROKER_URL)",
    )
    p.add_argument(
        "--exchange",
        default=DEFAULT_EXCHANGE,
        help=f"the workers' exchange (default {DEFAULT_EXCHANGE!r})",
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
        "--secret-file",
        default=None,
        metavar="PATH",
        help="signing keys, as the workers' (default: $FLOWENGINE_SECRET_FILE/$FLOWENGINE_SECRET)",
    )
    p.add_argument(
        "--durable",
        action="store_true",
        help="the workers run with --durable (the exchange is declared so)",
    )
    p.add_argument(
        "--queue-type",
        default="classic",
        choices=["classic", "quorum"],
        help="the workers run with --queue-type (their queues are declared so)",
    )
    p.add_argument(
        "--compat",
        default=None,
        choices=["taskflow"],
        help="the exchange is shared with TaskFlow (declared as it does)",
    )


def broker_settings(args: argparse.Namespace, why: str) -> Any:
    """The BrokerSettings ``args`` name; BrokerConfigError for memory:// (``why`` says why)."""
    from flowengine.engines.worker_based.messaging.settings import BrokerSettings
    from flowengine.engines.worker_based.transports import errors as broker_errors
    from flowengine.engines.worker_based.wire import signing

    broker_errors.check_shared(args.url, args.transport, why)
    secret = None if args.secret_file is None else signing.read_key_file(args.secret_file)
    return BrokerSettings(
        args.url,
        args.transport,
        dict(args.transport_options),
        None,
        durable=args.durable,
        secret=secret,
        compat=args.compat,
        queue_type=args.queue_type,
    )


def broker_uri(args: argparse.Namespace) -> str:
    """The broker ``args`` reach, as shown to a person: no password, defaults filled in.

    With neither ``--url`` nor ``--transport`` that is kombu's default
    (``amqp://guest:**@localhost:5672//``), named rather than "default broker".
    """
    from flowengine.engines.worker_based.messaging.settings import BrokerSettings
    from flowengine.utils.misc import mask_password

    try:
        return str(
            BrokerSettings(args.url, args.transport, dict(args.transport_options)).public_uri
        )
    except Exception:  # a URL kombu cannot read: shown as given, password masked
        return mask_password(args.url) if args.url else str(args.transport)


def where(args: argparse.Namespace) -> str:
    """The broker and exchange, as shown to a person (never with a password)."""
    return f"{broker_uri(args)} / {args.exchange}"
