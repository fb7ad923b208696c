"""Test helper process: takes one message with flowengine's Redis transport, never settles it.

Run by test_redis_transport.py with one JSON argument (keys: url, exchange,
queue, routing_key, private_queue, private_key, consumer_id, lease_s,
marker). It keeps the lease of ``consumer_id`` alive with a LeaseKeeper,
declares ``private_queue`` as its private queue, consumes ``queue`` and, once
it holds a message, writes ``marker`` (JSON: delivery_tag, correlation_id,
body) and waits to be killed -- the test SIGKILLs it there.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import kombu

from flowengine.engines.worker_based.transports import leases
from flowengine.engines.worker_based.transports import redis_consumers as rc

#: Bound (s) on how long this process waits for a message, and then for its
#: kill: a test that died before killing it must not leave it running.
WAIT_S = 60.0


def main(config: dict) -> int:
    """Hold one message of ``config['queue']`` until killed; 1 if none came."""
    conn = kombu.Connection(
        config["url"],
        transport="flowengine-redis",
        transport_options={
            rc.CONSUMER_OPTION: config["consumer_id"],
            rc.LEASE_OPTION: config["lease_s"],
        },
    )
    # The keeper clones its template from its own thread: give it one nobody
    # else uses (kombu creates a connection's transport lazily, unlocked).
    keeper = leases.LeaseKeeper(
        conn.clone(), config["consumer_id"], config["lease_s"], reclaim=False
    )
    keeper.start()
    exchange = kombu.Exchange(config["exchange"], type="direct")
    private_channel = conn.channel()
    private_channel.mark_private(config["private_queue"])
    kombu.Queue(
        config["private_queue"],
        exchange,
        routing_key=config["private_key"],
        channel=private_channel,
    ).declare()
    got = threading.Event()

    def on_message(body: object, message: kombu.Message) -> None:
        # Written whole, then renamed: the test never reads half a marker.
        partial = config["marker"] + ".partial"
        with open(partial, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "delivery_tag": message.delivery_tag,
                    "body": body,
                    "correlation_id": message.properties.get("correlation_id"),
                },
                fh,
            )
        os.replace(partial, config["marker"])
        got.set()

    queue = kombu.Queue(config["queue"], exchange, routing_key=config["routing_key"])
    consumer = kombu.Consumer(
        conn.channel(), queues=[queue], callbacks=[on_message], accept=["json"], prefetch_count=1
    )
    consumer.consume()
    deadline = time.monotonic() + WAIT_S
    while not got.is_set() and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=1.0)
        except TimeoutError:
            pass
    if not got.is_set():
        return 1
    threading.Event().wait(WAIT_S)  # held, unsettled, until the test kills us
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
