"""Where events travel: the fanout events exchange and connections to it.

The task exchange is direct, so events get an exchange of their own,
``<exchange>.events``: fanout, non-durable, transient messages, so nothing
is kept when nobody listens. Publisher and receiver connect the same way
the proxy does (same URL and transport resolution).
"""

from __future__ import annotations

import logging

from kombu.connection import Connection
from kombu.entity import Exchange

from flowengine.engines.worker_based.messaging.settings import BrokerSettings

LOG = logging.getLogger(__name__)

#: Suffix of the events exchange name (``<exchange>.events``): the task
#: exchange is direct, so events need an exchange of their own to fan out.
EVENTS_EXCHANGE_SUFFIX = ".events"


def events_exchange_name(exchange: str) -> str:
    """The events exchange that goes with task exchange ``exchange``."""
    return exchange + EVENTS_EXCHANGE_SUFFIX


def connection(broker: BrokerSettings) -> Connection:
    """A kombu connection to ``broker`` (not yet connected) for the event stream.

    Without AMQP heartbeats: event connections are driven by no loop that
    would send them, so a negotiated heartbeat would only get an idle
    publisher disconnected.
    """
    conn: Connection = broker.connection(heartbeat=0)
    return conn


def exchange(exchange_name: str) -> Exchange:
    """The fanout, non-durable events exchange for task exchange ``exchange_name``."""
    return Exchange(
        events_exchange_name(exchange_name),
        type="fanout",
        durable=False,
        auto_delete=False,
        delivery_mode="transient",
    )


def release(conn: Connection) -> None:
    """Release ``conn``, ignoring errors: a broken connection has nothing left to close."""
    try:
        conn.release()
    except Exception:  # already broken; nothing more to do
        LOG.debug("Error closing events connection", exc_info=True)
