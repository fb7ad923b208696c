"""Dramatiq 2.2 next to the worker-based engine: the same trivial task, broker and workers.

Used by ``bench_remote.py`` (``--lib dramatiq``); never imported by flowengine.
Dramatiq is installed into a virtualenv cached at
``~/.cache/flowengine-bench/dramatiq-venv`` on first use (like Celery's in
``bench_celery.py``); it is never a dependency of flowengine.

What is measured, on the same Redis or RabbitMQ as flowengine in the same run:

- ``throughput``: a ``group`` of n messages to a no-op actor, sent at once,
  from the first enqueue until every result is back (tasks/s);
- ``latency``: a ``pipeline`` of n no-op messages (each worker enqueues the
  next one; ``pipe_ignore`` so no result is passed on); the client sees only
  the pipeline's end, so the figure is the whole pipeline's time divided by n;
- ``one-task``: a fresh client (broker and result backend connections made
  inside the clock, as a fresh engine's run() makes its own) enqueues one
  message and waits for its result; median of several, one after another.

Results come back through Dramatiq's ``Results`` middleware with its Redis
backend on both brokers (Dramatiq has no result backend over AMQP), so on
RabbitMQ a Redis server is needed too. Workers: ``WORKERS`` processes, each
one ``dramatiq.Worker`` of ``WORKER_THREADS`` threads (the shape of
flowengine's bench workers), Dramatiq's defaults otherwise: prefetch of 2 x
threads, acknowledgement after processing, durable queues and persistent
messages on RabbitMQ. Dramatiq's Redis consumer polls: an idle queue is
fetched again after a back-off that doubles from 5 ms up to the worker
timeout (1 s by default), so on Redis what a task waits for is mostly that.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from typing import Any

#: Where the Dramatiq virtualenv is cached, and what is installed into it.
DRAMATIQ_VENV = os.path.join(os.path.expanduser("~"), ".cache", "flowengine-bench", "dramatiq-venv")
DRAMATIQ_SPEC = "dramatiq[redis,rabbitmq]==2.2.1"

#: Milliseconds a client waits for all results of one measurement
#: (Dramatiq's timeouts are in ms).
RESULT_TIMEOUT_MS = 120_000

#: Seconds a worker waits for its consumers to be up before giving up.
CONSUMERS_UP_TIMEOUT_S = 60.0

#: Milliseconds a stopping worker gives its threads to finish.
WORKER_STOP_TIMEOUT_MS = 10_000

#: Name of the benchmark's no-op actor.
ACTOR = "bench_noop"


def ensure_dramatiq_python(venv: str = DRAMATIQ_VENV, spec: str = DRAMATIQ_SPEC) -> str:
    """A python that imports dramatiq, pika and redis; creates the cached venv if needed."""
    import bench_core  # the parent's only (workers import this module in Dramatiq's venv)

    return bench_core.ensure_venv_python(venv, spec, "dramatiq, pika, redis")


def make_broker(url: str, results_url: str, queue: str) -> tuple[Any, Any, Any]:
    """A broker for ``url``, results kept in the Redis at ``results_url``, a no-op actor.

    The actor consumes ``queue``. Returns (broker, actor, result backend).
    """
    import dramatiq
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    backend = RedisBackend(url=results_url)
    if url.startswith("redis"):
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=url)
    else:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker = RabbitmqBroker(url=pika_url(url))
    broker.add_middleware(Results(backend=backend))

    def noop(*_args: Any) -> None:
        return None

    actor = dramatiq.actor(
        noop, actor_name=ACTOR, queue_name=queue, broker=broker, store_results=True
    )
    return broker, actor, backend


def pika_url(url: str) -> str:
    """kombu's AMQP URL as pika reads it: kombu's ``host//`` is the vhost ``/``, pika's ``%2F``."""
    return url[:-2] + "/%2F" if url.endswith("//") else url


def _connect(broker: Any, backend: Any, queue: str) -> None:
    """Open the client's broker and backend connections (and declare the queue)."""
    backend.client.ping()
    if hasattr(broker, "client"):  # Redis
        broker.client.ping()
    else:  # RabbitMQ: connects this thread and declares the queues
        broker.declare_queue(queue, ensure=True)


def worker_main(url: str, results_url: str, queue: str, threads: int, ready_line: str) -> int:
    """A Dramatiq worker process: prints ``ready_line`` once consuming, ends on SIGTERM."""
    import dramatiq

    broker, _actor, _backend = make_broker(url, results_url, queue)
    # The worker has one consumer per queue (the actor's and its delay
    # queue); it is ready when both hold a consumer (on RabbitMQ, a
    # connection consuming the queue).
    consumers_up = threading.Semaphore(0)
    consume = broker.consume

    def consume_and_count(*args: Any, **kwargs: Any) -> Any:
        consumer = consume(*args, **kwargs)
        consumers_up.release()
        return consumer

    broker.consume = consume_and_count
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_a: stop.set())
    worker = dramatiq.Worker(broker, worker_threads=threads)
    worker.start()
    for _ in range(2):
        if not consumers_up.acquire(timeout=CONSUMERS_UP_TIMEOUT_S):
            raise RuntimeError(f"Dramatiq's consumers were not up after {CONSUMERS_UP_TIMEOUT_S} s")
    print(ready_line, flush=True)
    stop.wait()
    worker.stop(timeout=WORKER_STOP_TIMEOUT_MS)
    broker.close()
    return 0


def client_case(url: str, results_url: str, queue: str, case: str, n: int) -> dict:
    """One measurement from the client's side (workers already up)."""
    from dramatiq import group, pipeline

    if case == "one-task":
        return _one_task_runs(url, results_url, queue, n)
    broker, actor, backend = make_broker(url, results_url, queue)
    # Connect before the clock starts (no message: the workers stay cold).
    _connect(broker, backend, queue)
    cpu = time.process_time()
    started = time.perf_counter()
    if case == "throughput":
        sent = group([actor.message() for _ in range(n)], broker=broker).run()
        got = sum(1 for _ in sent.get_results(block=True, timeout=RESULT_TIMEOUT_MS))
    else:
        messages = [actor.message_with_options(pipe_ignore=True) for _ in range(n)]
        pipeline(messages, broker=broker).run().get_result(block=True, timeout=RESULT_TIMEOUT_MS)
        got = n
    run_s = time.perf_counter() - started
    cpu = time.process_time() - cpu
    broker.close()
    if got != n:
        raise RuntimeError(f"{got} of {n} results came back")
    return {
        "tasks": n,
        "run_s": run_s,
        "per_task_ms": run_s / n * 1000.0,
        "tasks_per_s": n / run_s,
        "run_tasks_per_s": n / run_s,
        "cpu_per_task_ms": cpu / n * 1000.0,
    }


def _one_task_runs(url: str, results_url: str, queue: str, runs: int) -> dict:
    """``runs`` fresh clients one after another: each connects, sends one message, awaits it."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        broker, actor, backend = make_broker(url, results_url, queue)
        _connect(broker, backend, queue)
        actor.send().get_result(backend=backend, block=True, timeout=RESULT_TIMEOUT_MS)
        times.append((time.perf_counter() - started) * 1000.0)
        broker.close()
    return {"tasks": 1, "runs_ms": times, "run_ms": statistics.median(times)}
