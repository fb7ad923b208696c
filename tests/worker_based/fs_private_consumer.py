"""Test helper process: consumes its private queue over the filesystem transport.

Run by test_filesystem_private_queues.py with one JSON argument (keys:
data_folder, exchange, queue, routing_keys). It marks ``queue`` private,
declares it bound with each routing key, consumes it without ever
acknowledging, and writes to stdout one line ``ready`` once consuming, then
the JSON body of each message it takes. A line ``close`` on stdin (or stdin
closing) makes it close its connection cleanly and exit 0; the test may
SIGKILL it instead. Its INFO (and higher) logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time

import kombu

from flowengine.engines.worker_based import transports

#: Bound (s) on the life of this process: a test that died before stopping
#: it must not leave it running.
WAIT_S = 60.0

#: Longest wait (s) for one message before looking at ``closing`` again.
DRAIN_S = 0.05


def main(config: dict) -> int:
    """Consume ``config['queue']`` until told to close; 1 if never told."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    transports.register()
    closing = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                break
        closing.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    conn = kombu.Connection(
        "filesystem://localhost",
        transport=transports.FILESYSTEM,
        transport_options={"data_folder": config["data_folder"]},
    )
    channel = conn.channel()
    channel.mark_private(config["queue"])
    exchange = kombu.Exchange(config["exchange"], type="direct")
    queue = kombu.Queue(
        config["queue"],
        exchange=exchange,
        bindings=[kombu.binding(exchange, routing_key=key) for key in config["routing_keys"]],
    )

    def on_message(body: object, message: kombu.Message) -> None:
        print(json.dumps(body), flush=True)  # never acknowledged

    consumer = kombu.Consumer(channel, queues=[queue], callbacks=[on_message], accept=["json"])
    consumer.consume()
    print("ready", flush=True)
    deadline = time.monotonic() + WAIT_S
    while not closing.is_set() and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=DRAIN_S)
        except TimeoutError:
            pass
    conn.release()
    return 0 if closing.is_set() else 1


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
