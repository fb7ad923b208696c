"""Prometheus metrics of workers and engines (optional: ``pip install 'flowengine[metrics]'``).

Workers::

    flowengine worker ... --metrics-port 9808

    metrics = WorkerMetrics()
    worker = Worker(..., metrics=metrics)
    metrics.watch(worker)
    serve(9808, registry=metrics.registry)

Engines::

    metrics = EngineMetrics()
    metrics.watch(engine)            # after engines.load(...), before run()
    serve(9809, registry=metrics.registry)

Names and labels are listed in doc/source/operations.rst. The ``task`` label
is the task's class (``myapp.tasks.Charge``), never the atom's name: names
often carry an id (``charge-order-1234``) and would make a series per flow.
Each object has a
registry of its own (several workers in one process do not collide); give
``registry=prometheus_client.REGISTRY`` to join the process's default one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flowengine.utils import optional, reflection

try:
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise optional.missing_extra("metrics", e) from e

if TYPE_CHECKING:
    from flowengine.engines.worker_based.worker_side.middleware import Job
    from flowengine.engines.worker_based.worker_side.worker import Worker

#: Run-time histogram buckets (s): from a trivial task's few milliseconds to
#: the minutes a long body runs; Prometheus adds +Inf.
RUN_TIME_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

#: Address the metrics server listens on unless told: every interface, as
#: exporters do (Prometheus scrapes from another host).
DEFAULT_ADDRESS = "0.0.0.0"

#: The terminal task states an engine counts.
_ENGINE_STATES = ("SUCCESS", "FAILURE", "REVERTED", "RETRYING")


class WorkerMetrics:
    """A worker's metrics; the RequestMetrics its MetricsMiddleware counts into."""

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        self.registry = registry or prometheus_client.CollectorRegistry()
        labels = ("topic", "task")
        self.received_total = prometheus_client.Counter(
            "flowengine_worker_requests_received",
            "Requests taken by this worker",
            labels,
            registry=self.registry,
        )
        self.retried_total = prometheus_client.Counter(
            "flowengine_worker_requests_retried",
            "Requests taken that were dispatched before (attempt > 0)",
            labels,
            registry=self.registry,
        )
        self.outcomes = prometheus_client.Counter(
            "flowengine_worker_requests_finished",
            "Requests finished, by outcome",
            (*labels, "outcome"),
            registry=self.registry,
        )
        self.run_time = prometheus_client.Histogram(
            "flowengine_worker_request_run_seconds",
            "Run time of request bodies",
            labels,
            buckets=RUN_TIME_BUCKETS_S,
            registry=self.registry,
        )
        self._worker: Worker | None = None

    def received(self, job: Job, topic: str) -> None:
        """RequestMetrics: a request was taken."""
        task = job.work.task_cls
        self.received_total.labels(topic, task).inc()
        if job.headers.attempt:
            self.retried_total.labels(topic, task).inc()

    def finished(self, job: Job, topic: str, outcome: str, elapsed_s: float) -> None:
        """RequestMetrics: a request's body ended (or it was dropped, cancelled)."""
        task = job.work.task_cls
        self.outcomes.labels(topic, task, outcome).inc()
        if elapsed_s > 0:
            self.run_time.labels(topic, task).observe(elapsed_s)

    def watch(self, worker: Worker) -> None:
        """Also report ``worker``'s held and running requests and broker reconnects."""
        self._worker = worker
        self.registry.register(_WorkerGauges(worker))


class _WorkerGauges(Collector):
    """Values read from the worker at scrape time."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def collect(self) -> Iterator[Any]:
        held = self._worker.requests()
        gauge = GaugeMetricFamily(
            "flowengine_worker_held_requests",
            "Requests held (taken, queued or running)",
            labels=["state"],
        )
        for state in ("queued", "running"):
            gauge.add_metric([state], sum(1 for r in held if r["state"] == state))
        yield gauge
        reconnects = CounterMetricFamily(
            "flowengine_worker_broker_reconnects", "Consumer reconnections to the broker"
        )
        reconnects.add_metric([], sum(s.proxy.reconnect_count for s in self._worker.servers))
        yield reconnects


class EngineMetrics:
    """An engine's metrics: tasks by final state, run times, re-dispatches, reconnects."""

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        self.registry = registry or prometheus_client.CollectorRegistry()
        self.tasks = prometheus_client.Counter(
            "flowengine_engine_tasks",
            "Task state changes, by task and state",
            ("task", "state"),
            registry=self.registry,
        )
        self.run_time = prometheus_client.Histogram(
            "flowengine_engine_remote_run_seconds",
            "Run time of remote tasks (from RUNNING to the outcome)",
            ("task",),
            buckets=RUN_TIME_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_time = prometheus_client.Histogram(
            "flowengine_engine_remote_queue_seconds",
            "Time remote tasks waited for a worker (first dispatch to RUNNING)",
            ("task",),
            buckets=RUN_TIME_BUCKETS_S,
            registry=self.registry,
        )
        self.redispatches = prometheus_client.Counter(
            "flowengine_engine_redispatches",
            "Requests sent again because their worker fell silent or gave them back",
            ("task",),
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._executors: list[Any] = []
        self._classes: dict[str, str] = {}

    def watch(self, engine: Any) -> None:
        """Count ``engine``'s task states (and its remote executor's figures, if any)."""
        engine.atom_notifier.register("*", self._on_atom)
        self._engine = engine
        self._classes = {}
        executor = getattr(engine, "_task_executor", None)
        if executor is not None and hasattr(executor, "proxy"):
            with self._lock:
                if not self._executors:
                    self.registry.register(_EngineGauges(self._executors))
                self._executors.append(executor)

    def _on_atom(self, state: str, details: dict[str, Any]) -> None:
        name = details.get("task_name")
        if name is None or state not in _ENGINE_STATES:
            return
        task = self._class_of(name)
        self.tasks.labels(task, state).inc()
        if state not in ("SUCCESS", "FAILURE"):
            return
        stats = getattr(self._engine, "statistics", {}).get("atoms", {}).get(name)
        if not stats:
            return
        if "run_time" in stats:
            self.run_time.labels(task).observe(stats["run_time"])
        if "queue_time" in stats:
            self.queue_time.labels(task).observe(stats["queue_time"])
        extra = int(stats.get("dispatches", 1)) - 1
        if extra > 0:
            self.redispatches.labels(task).inc(extra)

    def _class_of(self, atom_name: str) -> str:
        """The class of the atom named ``atom_name`` (the label), looked up once per name."""
        task = self._classes.get(atom_name)
        if task is None:
            atom = self._engine.compilation.atoms.get(atom_name)
            task = reflection.get_class_name(atom) if atom is not None else atom_name
            self._classes[atom_name] = task
        return task


class _EngineGauges(Collector):
    def __init__(self, executors: list[Any]) -> None:
        self._executors = executors

    def collect(self) -> Iterator[Any]:
        in_flight = GaugeMetricFamily(
            "flowengine_engine_requests_in_flight", "Remote requests sent and not answered"
        )
        in_flight.add_metric([], sum(len(e.book) for e in self._executors))
        yield in_flight
        reconnects = CounterMetricFamily(
            "flowengine_engine_broker_reconnects", "Reply consumer reconnections to the broker"
        )
        reconnects.add_metric([], sum(e.proxy.reconnect_count for e in self._executors))
        yield reconnects


def serve(
    port: int, registry: prometheus_client.CollectorRegistry, address: str = DEFAULT_ADDRESS
) -> Any:
    """Serve ``registry`` on http://address:port/metrics in a daemon thread; the server.

    Raises OSError when the port cannot be bound.
    """
    server, _thread = prometheus_client.start_http_server(port, addr=address, registry=registry)
    return server
