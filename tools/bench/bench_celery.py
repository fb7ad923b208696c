"""Celery 5.7 next to the worker-based engine: the same tasks, broker and workers.

Used by ``bench_remote.py`` (``--lib celery``); never imported by flowengine.
Celery is installed into a virtualenv cached at
``~/.cache/flowengine-bench/celery-venv`` on first use (like TaskFlow's in
``bench_core.py``); it is never a dependency of flowengine.

What is measured, on the same Redis or RabbitMQ as flowengine in the same run:

- ``throughput``: a ``group`` of n no-op tasks sent at once, from the first
  ``apply_async`` until every result is back (tasks/s);
- ``latency``: a ``chain`` of n no-op tasks (each worker sends the next one);
  the client sees only the chain's end, so the figure is the whole chain's
  time divided by n (an upper bound of the per-task cost).

The client's broker and backend connections are made before the clock starts
(flowengine's figures include its engine's start instead); no task runs
before the measured one, as for flowengine.

Workers: ``WORKERS`` processes of ``--pool threads -c WORKER_THREADS``, the
shape of flowengine's bench workers. Results come back through Celery's
usual backend per broker: Redis for Redis, ``rpc://`` (replies over AMQP) for
RabbitMQ. Celery's defaults otherwise (early acknowledgement, prefetch
multiplier 4), without gossip, mingle and heartbeats (start-up only).
"""

from __future__ import annotations

import os
import time

#: Where the Celery virtualenv is cached, and what is installed into it.
CELERY_VENV = os.path.join(os.path.expanduser("~"), ".cache", "flowengine-bench", "celery-venv")
CELERY_SPEC = "celery[redis]==5.7.0"

#: Seconds a client waits for all results of one measurement.
RESULT_TIMEOUT_S = 120.0


def ensure_celery_python(venv: str = CELERY_VENV, spec: str = CELERY_SPEC) -> str:
    """Path of a python that can import celery, creating the cached venv if needed."""
    import bench_core  # the parent's only (workers import this module in Celery's venv)

    return bench_core.ensure_venv_python(venv, spec, "celery, redis")


def make_app(url: str):
    """The Celery app of one benchmark: broker ``url`` and its natural result backend."""
    from celery import Celery

    backend = url if url.startswith("redis") else "rpc://"
    app = Celery("bench", broker=url, backend=backend)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )

    @app.task(name="bench.noop")
    def noop(*_args):
        return None

    return app


def worker_main(url: str, threads: int, ready_line: str) -> int:
    """A Celery worker process (threads pool); prints ``ready_line`` once consuming."""
    from celery import signals

    app = make_app(url)

    @signals.worker_ready.connect
    def _ready(**_kw):
        print(ready_line, flush=True)

    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={threads}",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            f"--hostname=bench{os.getpid()}@%h",
        ]
    )
    return 0


def client_case(url: str, case: str, n: int) -> dict:
    """One measurement from the client's side (workers already up)."""
    from celery import chain, group

    app = make_app(url)
    noop = app.tasks["bench.noop"]
    # Connect before the clock starts (no task: the workers stay cold).
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3)
    _ = app.backend  # created lazily: create it now
    cpu = time.process_time()
    started = time.perf_counter()
    if case == "throughput":
        group(noop.s() for _ in range(n)).apply_async().get(timeout=RESULT_TIMEOUT_S)
    else:
        chain(noop.si() for _ in range(n)).apply_async().get(timeout=RESULT_TIMEOUT_S)
    run_s = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return {
        "tasks": n,
        "run_s": run_s,
        "per_task_ms": run_s / n * 1000.0,
        "tasks_per_s": n / run_s,
        "run_tasks_per_s": n / run_s,
        "cpu_per_task_ms": cpu / n * 1000.0,
    }
