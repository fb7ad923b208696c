"""Child process of the persistence tests: runs or resumes a flow, then exits.

    child.py start  URL EFFECTS [ENGINE]      new flow from flows.make_flow
    child.py resume URL FLOW_UUID [ENGINE]    resume a saved flow detail
    child.py chain  URL EFFECTS PREFIX N      run flows.make_chain once a line
                                              arrives on stdin (concurrency)
    child.py worker EXCHANGE TOPIC BROKER_DIR  a worker serving flows' tasks over
                                              the filesystem transport

Engine options (e.g. for ENGINE=worker-based) come as JSON in the
environment variable ``OPTIONS_ENV``.

Prints ``FLOW <uuid>`` once the flow detail is saved and ``STATE <state>``
at the end (plus what the tasks print, e.g. ``BLOCKED b``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flowengine import engines  # noqa: E402
from flowengine.persistence import backends, models  # noqa: E402
from tests.persistence import flows  # noqa: E402

#: Environment variable holding engine options as JSON.
OPTIONS_ENV = "FLOWENGINE_TEST_ENGINE_OPTIONS"
#: Threads of a worker: one stays blocked in the killed engine's task.
WORKER_THREADS = 4
#: Bound on a worker's start (fails instead of hanging).
WORKER_START_S = 30.0


def filesystem_transport(broker_dir: str) -> dict:
    """kombu filesystem transport options: one folder shared by everyone."""
    return {"data_folder_in": broker_dir, "data_folder_out": broker_dir, "store_processed": False}


def _worker(exchange: str, topic: str, broker_dir: str) -> int:
    from flowengine.engines.worker_based.worker_side import worker as wk

    worker = wk.Worker(
        exchange,
        topic,
        [flows],
        threads_count=WORKER_THREADS,
        transport="filesystem",
        transport_options=filesystem_transport(broker_dir),
    )
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    if not worker.wait(WORKER_START_S):
        raise SystemExit("worker did not start")
    _say("WORKER READY")
    thread.join()  # until killed
    return 0


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    mode, url = argv[0], argv[1]
    if mode == "worker":
        return _worker(argv[1], argv[2], argv[3])
    options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    engine_kind = argv[3] if len(argv) > 3 else "serial"
    with backends.backend(url) as backend:
        if mode == "start":
            book = models.LogBook("crash-test")
            engine = engines.load_from_factory(
                flows.make_flow,
                factory_args=[argv[2]],
                backend=backend,
                book=book,
                engine=engine_kind,
                **options,
            )
        elif mode == "resume":
            with contextlib.closing(backend.get_connection()) as conn:
                flow_detail = conn.get_flow_details(argv[2])
            engine = engines.load_from_detail(
                flow_detail, backend=backend, engine=engine_kind, **options
            )
        else:
            book = models.LogBook(f"chain-{argv[3]}")
            flow = flows.make_chain(argv[2], argv[3], int(argv[4]))
            engine = engines.load(flow, backend=backend, book=book)
        _say(f"FLOW {engine.storage.flow_uuid}")
        if mode == "chain":
            sys.stdin.readline()  # start gate: the parent releases all children at once
        engine.run()
        _say(f"STATE {engine.storage.get_flow_state()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
