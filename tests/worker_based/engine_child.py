"""An engine-side process for test_engine_leaves_nothing.py: an executor consuming replies.

Run with one JSON argument (url, transport, transport_options, exchange,
uuid); prints "ready" once its reply queue is declared and consumed, then
waits to be killed.
"""

from __future__ import annotations

import json
import sys
import threading

from flowengine.engines.worker_based.executor_side import executor as wex


def main() -> None:
    config = json.loads(sys.argv[1])
    executor = wex.WorkerTaskExecutor(
        config["uuid"],
        config["exchange"],
        ["t"],
        url=config.get("url"),
        transport=config.get("transport"),
        transport_options=config.get("transport_options"),
    )
    executor.start()
    print("ready", flush=True)
    threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main()
