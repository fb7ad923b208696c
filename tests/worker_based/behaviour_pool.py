"""The worker-based engine in the behaviour suite: one pool of in-process workers.

Two workers (memory transport) serve ``tests.engines.tasks`` for the whole
test session; every engine the suite loads talks to them through its own
WorkerTaskExecutor, as separate client processes would.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import uuid
from concurrent import futures
from typing import Any

from flowengine import engines

#: Workers in the shared pool; two, so requests really are spread.
POOL_WORKERS = 2

#: Threads per worker: enough for the suite's widest parallel branches.
POOL_THREADS = 4

#: Seconds to wait for a pool worker to start (only bounds a broken setup).
START_TIMEOUT_S = 10.0

#: Transport of the pool (in-process, no server needed).
TRANSPORT = "memory"

#: Seconds a request may wait for a pool worker: a task class no worker
#: serves then fails with RequestTimeout well before the test's own timeout.
TRANSITION_TIMEOUT_S = 10.0

_lock = threading.Lock()
_pool: dict[str, Any] | None = None


def _suite_modules() -> list[Any]:
    """``tests.engines.tasks`` plus every module already loaded from tests/engines.

    Tests define some task classes next to the test (at module level, so
    workers can have them); pytest has imported every test module by the time
    the first engine is loaded, under the name their classes carry.
    """
    from tests.engines import tasks

    folder = os.path.dirname(os.path.abspath(tasks.__file__))
    found = {id(tasks): tasks}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and os.path.dirname(os.path.abspath(path)) == folder:
            found.setdefault(id(module), module)
    return list(found.values())


def _start_pool() -> dict[str, Any]:
    from flowengine.engines.worker_based.worker_side import worker as wk

    exchange = f"behaviour-{uuid.uuid4().hex[:8]}"
    topic = "behaviour"
    modules = _suite_modules()
    running = []
    for _ in range(POOL_WORKERS):
        pool = futures.ThreadPoolExecutor(max_workers=POOL_THREADS)
        worker = wk.Worker(exchange, topic, modules, executor=pool, transport=TRANSPORT)
        thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
        thread.start()
        if not worker.wait(START_TIMEOUT_S):
            raise RuntimeError("a behaviour-suite worker did not start")
        running.append((worker, pool, thread))

    def stop() -> None:
        for worker, pool, thread in running:
            worker.stop()
            pool.shutdown(wait=True)
            thread.join(START_TIMEOUT_S)

    atexit.register(stop)
    return {
        "exchange": exchange,
        "topics": [topic],
        "transport": TRANSPORT,
        "transition_timeout": TRANSITION_TIMEOUT_S,
    }


def pool_options() -> dict[str, Any]:
    """Engine options reaching the shared pool (started on first use)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = _start_pool()
        return dict(_pool)


def load_worker_based(flow: Any, store: Any, options: dict) -> Any:
    """Behaviour-suite loader: a worker-based engine using the shared pool."""
    return engines.load(flow, store=store, engine="worker-based", **{**pool_options(), **options})
