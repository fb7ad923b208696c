#!/usr/bin/env python3
"""Remote-task benchmark: the worker-based engine next to TaskFlow and raw kombu.

For each transport (memory, filesystem, Redis, RabbitMQ; brokers started by
this script on loopback with ``tests/brokers.py``) and in the same run:

- ``floor``: a raw kombu request/reply round trip (one process publishes a
  request, a server process answers on the reply queue), sequential; the
  fastest anything built on kombu can hand a task to a worker and hear back.
  ``floor-3``: the same with two replies, the first sent before the request
  is acknowledged: the three messages flowengine's reliable protocol needs.
- ``latency``: a linear flow of 50 trivial tasks on the worker-based engine;
  per-task latency is the time between consecutive task completions (so the
  engine's start and worker discovery are not in it), plus the whole run.
- ``serial``: the same flow on the local serial engine, which runs each task
  in the calling thread: what the engine itself costs per task. Added to
  ``floor-3`` it gives the least a remote task could take with flowengine's
  engine and protocol (``least``), were the remote parts free.
- ``throughput``: an unordered flow of 500 trivial tasks on 2 worker
  processes; tasks completed per second.

for flowengine, TaskFlow with its defaults (``taskflow-default``) and TaskFlow
with a tuned polling interval (``taskflow-tuned``: ``transport_options=
{"polling_interval": TUNED_POLLING_INTERVAL_S}``, which TaskFlow uses both as
kombu's polling interval and as its own drain-events timeout). Workers are
separate processes (threads inside the engine's process for ``memory``, whose
broker lives in one process). Each case runs in a fresh subprocess.

kombu's own memory and filesystem transports poll every second; flowengine
uses its own drop-in transports for those URLs, and so does the floor (raw
kombu code on flowengine's transport), since kombu's filesystem transport
would make the floor about a second. TaskFlow runs on kombu's transports.

TaskFlow comes from PyPI into the virtualenv ``bench_core.py`` caches (with
kombu and redis added); it is never a flowengine dependency.

Usage::

    python tools/bench/bench_remote.py                    # everything
    python tools/bench/bench_remote.py --transport redis --lib flowengine --lib floor
    python tools/bench/bench_remote.py --tiny --transport memory --lib flowengine  # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench_core  # noqa: E402  (the cached TaskFlow virtualenv)

TRANSPORTS = ("memory", "filesystem", "redis", "amqp")
LIBS = (
    "floor",
    "floor-fe",
    "flowengine",
    "flowengine-base",
    "flowengine-late",
    "celery",
    "dramatiq",
    "taskflow-tuned",
    "taskflow-default",
)

#: Libraries run by default (``flowengine-base`` needs ``--baseline``).
DEFAULT_LIBS = tuple(lib for lib in LIBS if lib != "flowengine-base")

#: Celery and Dramatiq run on real brokers only (Celery's memory transport
#: lives in one process; Dramatiq has none).
CELERY_TRANSPORTS = ("redis", "amqp")

#: The peers: task queues measured from their client's side (bench_celery.py,
#: bench_dramatiq.py), on CELERY_TRANSPORTS only.
PEERS = ("celery", "dramatiq")

#: The floor on flowengine's own Redis and AMQP transports (``floor-fe``):
#: on memory and filesystem the floor runs on them anyway.
FLOOR_FE_TRANSPORTS = ("redis", "amqp")

#: Repetitions of every case (interleaved), for medians with min and max.
REPEAT = 5

#: TaskFlow with its defaults is 10-100x slower than the rest and its figures
#: are shown for scale only: measured this many times, not REPEAT.
TASKFLOW_DEFAULT_REPEAT = 1

#: Fresh engines run one after another, per one-task case process (each a
#: 1-task flow, from run() to its result, workers already up).
ONE_TASK_RUNS = 5

#: Tasks in the latency flow (linear) and the throughput flow (unordered).
LATENCY_TASKS = 50
THROUGHPUT_TASKS = 500

#: TaskFlow with its defaults pays about a second or two per task on polling
#: transports: fewer tasks keep a full run within minutes (per-task figures
#: are still per task).
DEFAULT_TASKFLOW_LATENCY_TASKS = 10
DEFAULT_TASKFLOW_THROUGHPUT_TASKS = 100

#: Sequential round trips measured for the floor (after FLOOR_WARMUP ones).
FLOOR_ROUND_TRIPS = 300
FLOOR_WARMUP = 20

#: The floor of flowengine's reliable protocol: three messages per task
#: (request; the worker's PENDING, sent before it acknowledges the request;
#: the outcome), the least a worker that never loses an accepted request
#: can send (see doc/source/reliability.rst).
FLOOR_3 = "floor-3"

#: Worker processes (and threads in each) serving the flows.
WORKERS = 2
WORKER_THREADS = 4

#: TaskFlow's tuned polling interval (s): small enough that polling is not
#: what a task waits for, large enough not to burn a core while idle.
TUNED_POLLING_INTERVAL_S = 0.005

#: Seconds one case may take before it is reported as a timeout.
CASE_TIMEOUT_S = 120.0

#: TaskFlow on kombu's filesystem transport hangs on replies read out of order
#: (RUNNING after SUCCESS): it never finishes, so do not wait long for it.
TASKFLOW_FILESYSTEM_TIMEOUT_S = 30.0

#: Seconds to wait for a worker process to say it is ready.
WORKER_READY_TIMEOUT_S = 60.0

#: Seconds a worker process gets after SIGTERM before it is killed.
WORKER_STOP_TIMEOUT_S = 10.0

#: Extra packages the TaskFlow virtualenv needs for its worker-based engine.
TASKFLOW_EXTRA = ("kombu", "redis")

READY = "BENCH-WORKER-READY"
TOPIC = "bench"


# --------------------------------------------------------------------------
# connection settings per transport and library
# --------------------------------------------------------------------------


def connection(
    lib: str, transport: str, url: str | None, folder: str | None, results_url: str | None = None
) -> dict:
    """engines.load / Worker keywords (url, transport, transport_options).

    Dramatiq's also name the Redis its results go to (``results_url``).
    """
    opts: dict[str, Any] = {}
    conn: dict[str, Any] = {}
    if lib == "dramatiq":
        conn["results_url"] = results_url
    if transport == "memory":
        conn["transport"] = "memory"
    elif transport == "filesystem":
        conn["transport"] = "filesystem"
        # control_folder too: kombu's stock transport (TaskFlow's side)
        # otherwise writes exchange metadata into ./control.
        opts.update(
            {
                "data_folder_in": folder,
                "data_folder_out": folder,
                "control_folder": os.path.join(folder, "control"),
                "store_processed": False,
            }
        )
    else:
        conn["url"] = url
    if lib == "floor-fe":
        conn["floor_transport"] = "flowengine"
    if lib == "taskflow-tuned":
        opts["polling_interval"] = TUNED_POLLING_INTERVAL_S
    if opts:
        conn["transport_options"] = opts
    return conn


#: The flowengine tree ``flowengine-base`` runs (``--baseline``): "before" in the same run.
BASELINE_TREE: str | None = os.environ.get("FLOWENGINE_BENCH_BASELINE")


def _lib_env(lib: str) -> dict[str, str]:
    env = dict(os.environ)
    env["FLOWENGINE_BENCH_LIB"] = "taskflow" if lib.startswith("taskflow") else "flowengine"
    paths = [HERE]
    if lib == "flowengine-base":
        if BASELINE_TREE is None:
            raise SystemExit("--lib flowengine-base needs --baseline PATH")
        paths.append(BASELINE_TREE)
        env["FLOWENGINE_BENCH_BASELINE"] = BASELINE_TREE
    elif lib in ("floor", "floor-fe", "flowengine", "flowengine-late"):
        paths.append(REPO_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _is_flowengine(lib: str) -> bool:
    return lib in ("flowengine", "flowengine-base", "flowengine-late")


#: Engine options of the flowengine variants: ``flowengine-late`` is this
#: tree with workers sparing the PENDING of requests they answer at once.
FLOWENGINE_OPTIONS = {"flowengine-late": {"late_pending": True}}


# --------------------------------------------------------------------------
# workers (child side)
# --------------------------------------------------------------------------


def make_worker(lib: str, exchange: str, conn: dict) -> tuple[Any, Any]:
    """A worker object (not started) and the pool given to it (None: its own), for ``lib``."""
    import bench_remote_tasks

    if lib.startswith("taskflow"):
        from concurrent import futures

        from taskflow.engines.worker_based import worker

        pool = futures.ThreadPoolExecutor(max_workers=WORKER_THREADS)
        return worker.Worker(
            exchange, TOPIC, [bench_remote_tasks.Noop], executor=pool, **conn
        ), pool
    from flowengine.engines.worker_based.worker_side import worker

    # flowengine's own pool (WORKER_THREADS threads), as a worker
    # made without an executor has; stop() shuts it down.
    return worker.Worker(
        exchange, TOPIC, [bench_remote_tasks.Noop], threads_count=WORKER_THREADS, **conn
    ), None


class RunningWorker(NamedTuple):
    """A worker start_worker_thread() runs, its given pool (None: its own) and its thread."""

    worker: Any
    pool: Any
    thread: threading.Thread


def start_worker_thread(lib: str, exchange: str, conn: dict) -> RunningWorker:
    """Run a worker in a daemon thread of this process; return once it consumes."""
    w, pool = make_worker(lib, exchange, conn)
    if lib.startswith("taskflow"):
        thread = threading.Thread(target=w.run, daemon=True)
        thread.start()
        w.wait()  # TaskFlow's wait() takes no timeout
    else:
        thread = threading.Thread(target=w.run, kwargs={"display_banner": False}, daemon=True)
        thread.start()
        if not w.wait(WORKER_READY_TIMEOUT_S):
            raise RuntimeError("worker did not start")
    return RunningWorker(w, pool, thread)


def stop_worker(running: RunningWorker) -> None:
    """Stop a worker start_worker_thread() started (and the pool it was given).

    Waits for run() to return: its consume loops then have closed their
    channels, so a process that exits next leaves nothing behind in the
    broker (on Redis: a lease, a private queue, an unsettled wake-up).
    """
    running.worker.stop()
    running.thread.join(WORKER_STOP_TIMEOUT_S)
    if running.pool is not None:
        running.pool.shutdown(wait=False)


@contextlib.contextmanager
def worker_threads(lib: str, exchange: str, conn: dict, count: int):
    """``count`` workers of ``lib`` in threads of this process, consuming when the block starts."""
    running = [start_worker_thread(lib, exchange, conn) for _ in range(count)]
    try:
        yield running
    finally:
        for each in running:
            stop_worker(each)


def worker_main(lib: str, exchange: str, conn: dict) -> int:
    """A worker process: serve until SIGTERM; print READY once consuming."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    running = start_worker_thread(lib, exchange, conn)
    print(READY, flush=True)
    stop.wait()
    stop_worker(running)
    return 0


@contextlib.contextmanager
def worker_processes(
    lib: str, exchange: str, conn: dict, count: int, command: list[str] | None = None
):
    """``count`` worker processes of ``lib`` on ``conn``, ready when the block starts.

    ``command``: what each runs (default: this script's worker role); it
    must print READY once consuming and end on SIGTERM.
    """
    procs = []
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--role",
        "worker",
        "--lib",
        lib,
        "--exchange",
        exchange,
        "--conn",
        json.dumps(conn),
    ]
    if lib == "celery":
        cmd = [
            sys.executable,
            "-c",
            "import sys, bench_celery; sys.exit("
            f"bench_celery.worker_main({conn['url']!r}, {WORKER_THREADS}, {READY!r}))",
        ]
    if lib == "dramatiq":
        cmd = [
            sys.executable,
            "-c",
            "import sys, bench_dramatiq; sys.exit(bench_dramatiq.worker_main("
            f"{conn['url']!r}, {conn['results_url']!r}, {exchange!r}, {WORKER_THREADS},"
            f" {READY!r}))",
        ]
    if command is not None:
        cmd = command
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, text=True, env=_lib_env(lib), cwd=HERE
                )
            )
        for proc in procs:
            _wait_ready(proc)
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(WORKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def workers(lib: str, transport: str, exchange: str, conn: dict, command: list[str] | None = None):
    """WORKERS workers of ``lib`` for ``transport``, as a context manager.

    Threads of this process on ``memory`` (its broker lives in one process),
    worker processes otherwise (``command``: see worker_processes()).
    """
    if transport == "memory":
        return worker_threads(lib, exchange, conn, WORKERS)
    return worker_processes(lib, exchange, conn, WORKERS, command=command)


def _wait_ready(proc: subprocess.Popen) -> None:
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if line.strip() == READY:
                ready.set()
        ready.set()  # EOF: the process ended

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(WORKER_READY_TIMEOUT_S) or proc.poll() is not None:
        raise RuntimeError(f"worker process {proc.pid} did not start")


# --------------------------------------------------------------------------
# flows (child side)
# --------------------------------------------------------------------------


def run_flow(
    lib: str,
    shape: str,
    n: int,
    exchange: str,
    conn: dict,
    engine_kind: str = "worker-based",
    **options: Any,
) -> dict:
    """Run a linear/unordered flow of ``n`` Noop tasks; time each completion.

    ``options``: more engine options (flowengine's ``shared``...).
    """
    import bench_remote_tasks

    if lib.startswith("taskflow"):
        from taskflow import engines
        from taskflow.patterns import linear_flow, unordered_flow
    else:
        from flowengine import engines
        from flowengine.patterns import linear_flow, unordered_flow
    pattern = linear_flow if shape == "linear" else unordered_flow
    flow = pattern.Flow(shape).add(*[bench_remote_tasks.Noop(f"t{i}") for i in range(n)])
    if engine_kind == "worker-based":
        options = {**FLOWENGINE_OPTIONS.get(lib, {}), **options}
        engine = engines.load(
            flow, engine=engine_kind, exchange=exchange, topics=[TOPIC], **conn, **options
        )
    else:
        engine = engines.load(flow, engine=engine_kind)
    done: list[float] = []
    # Process CPU at each completion: between the first and the last, what
    # each further task cost, the engine's start and stop left out.
    done_cpu: list[float] = []

    # The process's context switches at the first and the last completion:
    # how often its threads handed work to each other per task, steady.
    switches: list[int | None] = []

    def on_atom(state: str, details: dict) -> None:
        if state == "SUCCESS":
            done.append(time.perf_counter())
            done_cpu.append(time.process_time())
            if len(done) in (1, n):
                switches.append(context_switches())

    engine.atom_notifier.register("*", on_atom)
    cpu = time.process_time()
    started = time.perf_counter()
    engine.run()
    run_s = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if len(done) != n:
        raise RuntimeError(f"{len(done)} of {n} tasks reported SUCCESS")
    span = done[-1] - done[0]
    # CPU of this process (the engine; and the workers too for memory) per task:
    # unlike wall time it hardly moves when the machine is busy.
    result = {
        "tasks": n,
        "run_s": run_s,
        "first_s": done[0] - started,
        "run_tasks_per_s": n / run_s,
        "cpu_per_task_ms": cpu / n * 1000.0,
    }
    if n > 1:
        result.update(
            {
                "per_task_ms": span / (n - 1) * 1000.0,
                "tasks_per_s": (n - 1) / span,
                "steady_cpu_per_task_ms": (done_cpu[-1] - done_cpu[0]) / (n - 1) * 1000.0,
            }
        )
        first, last = switches[0], switches[-1]
        if first is not None and last is not None:
            result["steady_switches_per_task"] = (last - first) / (n - 1)
    return result


def context_switches() -> int | None:
    """Context switches (voluntary and not) of this process's threads so far; None off Linux.

    A thread that blocks handing work to another, or waits for the
    interpreter lock, counts one; threads that ended are not counted.
    """
    total = 0
    try:
        names = os.listdir("/proc/self/task")
    except OSError:
        return None
    for name in names:
        try:
            with open(f"/proc/self/task/{name}/status") as status:
                for line in status:
                    if "ctxt_switches" in line:
                        total += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            continue
    return total


def one_task_runs(lib: str, exchange: str, conn: dict) -> dict:
    """ONE_TASK_RUNS fresh engines of a 1-task flow, one after another: run() in ms.

    For ``flowengine`` also ``shared_run_ms``: as many more with ``shared=True``,
    the first of which starts the executor the others find up.
    """

    def median_ms(**options: Any) -> tuple[list[float], float]:
        runs = [
            run_flow(lib, "linear", 1, exchange, conn, **options)["run_s"] * 1000.0
            for _ in range(ONE_TASK_RUNS)
        ]
        return runs, sorted(runs)[len(runs) // 2]

    runs, run_ms = median_ms()
    result = {"tasks": 1, "runs_ms": runs, "run_ms": run_ms}
    if lib == "flowengine":
        result["shared_runs_ms"], result["shared_run_ms"] = median_ms(shared=True)
    return result


def flow_case(lib: str, case: str, n: int, transport: str, conn: dict) -> dict:
    """One latency/throughput case with its workers (threads for memory)."""
    exchange = f"bench-{uuid.uuid4().hex[:8]}"
    shape = "linear" if case == "latency" else "unordered"
    if case == "serial":
        return run_flow(lib, "linear", n, exchange, conn, engine_kind="serial")
    if lib == "celery":
        import bench_celery

        with worker_processes(lib, exchange, conn, WORKERS):
            return bench_celery.client_case(conn["url"], case, n)
    if lib == "dramatiq":
        import bench_dramatiq

        with worker_processes(lib, exchange, conn, WORKERS):
            return bench_dramatiq.client_case(conn["url"], conn["results_url"], exchange, case, n)

    def measure() -> dict:
        if case == "one-task":
            return one_task_runs(lib, exchange, conn)
        return run_flow(lib, shape, n, exchange, conn)

    with workers(lib, transport, exchange, conn):
        return measure()


# --------------------------------------------------------------------------
# the floor: raw kombu request/reply (child side)
# --------------------------------------------------------------------------


def _kombu_connection(conn: dict):
    """kombu's own transport for a broker URL (Redis, AMQP); flowengine's otherwise.

    The floor on a real broker is kombu as it comes, so that nothing
    flowengine changes in its own transports moves the floor; kombu's memory
    and filesystem transports poll once a second, so there the floor runs on
    flowengine's drop-in transports. ``floor-fe`` (``floor_transport`` in
    ``conn``) runs the same client and server on flowengine's Redis and AMQP
    transports: what those save kombu's own request/reply, and so how much
    of a remote task's cost is the engine's and not the messages'.
    """
    import kombu

    from flowengine.engines.worker_based import transports

    url = conn.get("url")
    if url and conn.get("floor_transport") == "flowengine":
        return kombu.Connection(
            url,
            transport=transports.resolve(url, None),
            transport_options=conn.get("transport_options", {}),
        )
    if url:
        return kombu.Connection(url, transport_options=conn.get("transport_options", {}))
    transport = transports.resolve(url, conn.get("transport"))
    return kombu.Connection(
        f"{transport}://", transport=transport, transport_options=conn.get("transport_options", {})
    )


def floor_server(
    exchange: str,
    conn: dict,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
    replies: int = 1,
) -> None:
    """Answer every request on the floor's request queue with ``replies`` replies.

    With 2, as a flowengine worker answers a flowengine engine: a first reply
    (its PENDING), then the acknowledgement, then the outcome.
    """
    import kombu

    stop = stop or threading.Event()
    ex = kombu.Exchange(exchange, type="direct", durable=False)
    with _kombu_connection(conn) as c:
        producer = kombu.Producer(c.channel(), exchange=ex)

        def on_message(body: Any, message: Any) -> None:
            reply_to = message.properties["reply_to"]
            cid = message.properties["correlation_id"]
            for _ in range(replies - 1):
                producer.publish(
                    {"state": "PENDING"},
                    routing_key=reply_to,
                    correlation_id=cid,
                    serializer="json",
                )
            message.ack()
            producer.publish(
                {"ok": True}, routing_key=reply_to, correlation_id=cid, serializer="json"
            )

        queue = kombu.Queue(
            f"{exchange}-req", ex, routing_key="req", durable=False, auto_delete=True
        )
        with kombu.Consumer(c.channel(), [queue], callbacks=[on_message], accept=["json"]):
            if ready is not None:
                ready.set()
            else:
                print(READY, flush=True)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    c.drain_events(timeout=0.2)


def floor_client(exchange: str, conn: dict, trips: int, replies: int = 1) -> dict:
    """Sequential requests, each done once its ``replies`` replies came; the mean and the median."""
    import collections

    import kombu

    ex = kombu.Exchange(exchange, type="direct", durable=False)
    reply_key = f"reply-{uuid.uuid4().hex[:8]}"
    got: collections.Counter[str] = collections.Counter()
    with _kombu_connection(conn) as c:
        producer = kombu.Producer(c.channel(), exchange=ex)
        queue = kombu.Queue(
            f"{exchange}-{reply_key}", ex, routing_key=reply_key, durable=False, auto_delete=True
        )

        def on_reply(body: Any, message: Any) -> None:
            got[message.properties["correlation_id"]] += 1
            message.ack()

        times = []
        with kombu.Consumer(c.channel(), [queue], callbacks=[on_reply], accept=["json"]):
            for i in range(trips + FLOOR_WARMUP):
                if i == FLOOR_WARMUP:
                    cpu = time.process_time()
                    switches = context_switches()
                cid = str(i)
                t0 = time.perf_counter()
                producer.publish(
                    {"n": i},
                    routing_key="req",
                    reply_to=reply_key,
                    correlation_id=cid,
                    serializer="json",
                )
                deadline = time.monotonic() + 30
                while got[cid] < replies:
                    if time.monotonic() > deadline:
                        raise RuntimeError("no reply from the floor server in 30 s")
                    with contextlib.suppress(TimeoutError):
                        c.drain_events(timeout=1)
                if i >= FLOOR_WARMUP:
                    times.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu
    switched = context_switches()
    times.sort()
    result = {
        "trips": trips,
        "per_task_ms": sum(times) / len(times) * 1000.0,
        "median_ms": times[len(times) // 2] * 1000.0,
        "cpu_per_task_ms": cpu / trips * 1000.0,
    }
    if switches is not None and switched is not None:
        result["switches_per_task"] = (switched - switches) / trips
    return result


def floor_case(transport: str, conn: dict, trips: int, replies: int = 1) -> dict:
    """The floor with its server in a thread (memory) or a process (the rest)."""
    exchange = f"floor-{uuid.uuid4().hex[:8]}"
    if transport == "memory":
        ready, stop = threading.Event(), threading.Event()
        server = threading.Thread(
            target=floor_server, args=(exchange, conn, ready, stop, replies), daemon=True
        )
        server.start()
        ready.wait(WORKER_READY_TIMEOUT_S)
        try:
            return floor_client(exchange, conn, trips, replies)
        finally:
            stop.set()
            server.join(5)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--role",
        "floor-server",
        "--exchange",
        exchange,
        "--conn",
        json.dumps(conn),
        "--n",
        str(replies),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=_lib_env("floor"), cwd=HERE)
    try:
        _wait_ready(proc)
        return floor_client(exchange, conn, trips, replies)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------


def taskflow_python(venv: str, spec: str) -> str:
    """bench_core's cached TaskFlow python, with kombu and redis added once."""
    python = bench_core.ensure_taskflow_python(venv, spec)
    if not all(bench_core._can_import(python, m) for m in ("kombu", "redis")):
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *TASKFLOW_EXTRA],
            check=True,
        )
    return python


def run_case(
    python: str,
    lib: str,
    case: str,
    transport: str,
    url: str | None,
    n: int,
    timeout_s: float,
    cpu: int | None = None,
    results_url: str | None = None,
) -> dict:
    """One case in a fresh subprocess of ``python``; its JSON result or an error.

    ``cpu``: run the case, and the worker or server processes it starts, on
    that CPU only (the broker stays free). ``results_url``: the Redis
    Dramatiq's results go to.
    """
    base = {"lib": lib, "case": case, "transport": transport}
    folder = tempfile.mkdtemp(prefix="fe-bench-fs-") if transport == "filesystem" else None
    conn = connection(lib, transport, url, folder, results_url)
    cmd = [
        python,
        os.path.abspath(__file__),
        "--role",
        "case",
        "--lib",
        lib,
        "--case",
        case,
        "--transport",
        transport,
        "--n",
        str(n),
        "--conn",
        json.dumps(conn),
    ]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    # A session of its own: a case that times out is killed with the worker
    # processes it started (they would otherwise live on, orphaned).
    child = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_lib_env(lib),
        cwd=HERE,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {**base, "error": f"timeout after {timeout_s:.0f} s"}
    finally:
        if folder:
            subprocess.run(["rm", "-rf", folder], check=False)
    proc = subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {**base, "error": f"exit {proc.returncode}: {last}"}
    return {**base, **json.loads(proc.stdout.strip().splitlines()[-1])}


@contextlib.contextmanager
def broker_urls(transports: list[str]):
    """Start the brokers the transports need (tests/brokers.py); yield kind -> URL."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    import brokers

    urls: dict[str, str | None] = {"memory": None, "filesystem": None}
    started = []
    try:
        for kind, starter in (("redis", brokers.start_redis), ("amqp", brokers.start_rabbitmq)):
            if kind in transports:
                try:
                    proc = starter()
                except brokers.BrokerUnavailable as e:
                    print(f"# {kind}: cannot start a broker, skipped ({e})", file=sys.stderr)
                    continue
                started.append(proc)
                urls[kind] = proc.url
        yield urls
    finally:
        for proc in started:
            proc.stop()


def _fmt(v: float | None, unit: str = "ms") -> str:
    return "-" if v is None else f"{v:.2f}{unit}" if v < 100 else f"{v:.0f}{unit}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summarize(results: list[dict]) -> dict[tuple[str, str, str], dict[str, tuple]]:
    """(transport, lib, case) -> key -> (median, min, max, count) over the repetitions."""
    values: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in results:
        if "error" in r:
            continue
        keys = values.setdefault((r["transport"], r["lib"], r["case"]), {})
        for key, value in r.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                keys.setdefault(key, []).append(float(value))
    return {
        case: {key: (_median(v), min(v), max(v), len(v)) for key, v in keys.items()}
        for case, keys in values.items()
    }


def print_table(results: list[dict], out=sys.stdout) -> None:
    """Latency, one-task run and throughput per transport: medians [min-max], ratios."""
    summary = summarize(results)

    def stat(t: str, lib: str, case: str, key: str) -> tuple | None:
        return summary.get((t, lib, case), {}).get(key)

    def med(t: str, lib: str, case: str, key: str) -> float | None:
        got = stat(t, lib, case, key)
        return None if got is None else got[0]

    def cell(t: str, lib: str, case: str, key: str, unit: str = "") -> str:
        got = stat(t, lib, case, key)
        if got is None:
            return "-"
        m, lo, hi, count = got
        if count == 1:
            return _fmt(m, unit)
        return f"{_fmt(m, unit)} [{_fmt(lo, unit)}-{_fmt(hi, unit)}]"

    transports = [t for t in TRANSPORTS if any(k[0] == t for k in summary)]
    libs = {k[1] for k in summary}
    reps = max((v[3] for keys in summary.values() for v in keys.values()), default=0)
    print(f"\nmedian [min-max] of up to {reps} repetitions, interleaved", file=out)

    print(
        "\nPer-task latency, 50-task linear flow (ms per task; floor = raw kombu"
        " request/reply round trip; Celery: chain time / n; Dramatiq: pipeline time / n)",
        file=out,
    )
    cols = [("floor", "floor", "floor"), ("flowengine", "flowengine", "latency")]
    if "flowengine-base" in libs:
        cols.append(("fe base", "flowengine-base", "latency"))
    if "flowengine-late" in libs:
        cols.append(("fe late", "flowengine-late", "latency"))
    cols += [
        ("Celery", "celery", "latency"),
        ("Dramatiq", "dramatiq", "latency"),
        ("TF tuned", "taskflow-tuned", "latency"),
        ("TF default", "taskflow-default", "latency"),
    ]
    print(
        "| transport | "
        + " | ".join(c[0] for c in cols)
        + " | fe/floor | base/floor | fe/TF tuned | fe/Celery | fe/Dramatiq | CPU fe | CPU floor"
        " | floor 3 msgs | fe/floor 3 msgs | serial engine | least | fe/least |",
        file=out,
    )
    print("|---" * (len(cols) + 13) + "|", file=out)
    for t in transports:
        fl = med(t, "floor", "floor", "per_task_ms")
        fe = med(t, "flowengine", "latency", "per_task_ms")
        base = med(t, "flowengine-base", "latency", "per_task_ms")
        tt = med(t, "taskflow-tuned", "latency", "per_task_ms")
        cel = med(t, "celery", "latency", "per_task_ms")
        dra = med(t, "dramatiq", "latency", "per_task_ms")
        floor_3 = med(t, "floor", FLOOR_3, "per_task_ms")
        serial = med(t, "flowengine", "serial", "per_task_ms")
        least = None if floor_3 is None or serial is None else floor_3 + serial
        cells = [cell(t, lib, case, "per_task_ms") for _, lib, case in cols]
        print(
            f"| {t} | "
            + " | ".join(cells)
            + f" | {_ratio(fe, fl)} | {_ratio(base, fl)} | {_ratio(fe, tt)}"
            f" | {_ratio(fe, cel)} | {_ratio(fe, dra)}"
            f" | {_fmt(med(t, 'flowengine', 'latency', 'cpu_per_task_ms'))}"
            f" | {_fmt(med(t, 'floor', 'floor', 'cpu_per_task_ms'))}"
            f" | {cell(t, 'floor', FLOOR_3, 'per_task_ms')}"
            f" | {_ratio(fe, floor_3)} | {cell(t, 'flowengine', 'serial', 'per_task_ms')}"
            f" | {_fmt(least)} | {_ratio(fe, least)} |",
            file=out,
        )
    print(
        "(CPU: CPU time of the engine process per task, the client's per round trip for"
        " the floor; for memory the workers are in that process too. floor 3 msgs: the"
        " raw kombu exchange of a request and two replies, the first sent before the"
        " request is acknowledged, as a flowengine worker answers. serial engine: the"
        " same flow on the local serial engine, tasks run in the engine's thread. least: floor 3"
        " msgs + serial engine, the least a remote task could take with this engine and"
        " protocol were all else free)",
        file=out,
    )

    cpu_cols = [
        (name, lib)
        for name, lib in (
            ("floor", "floor"),
            ("floor fe", "floor-fe"),
            ("fe base", "flowengine-base"),
            ("flowengine", "flowengine"),
            ("fe late", "flowengine-late"),
        )
        if lib in libs
    ]
    floors = ("floor", "floor-fe")
    if any(lib not in floors for _, lib in cpu_cols):
        print(
            "\nCPU per task, steady (ms; the engine process from the first completion to the"
            " last of the 50-task flow; floor: the client's per round trip)",
            file=out,
        )
        ratio_cols = [(name, lib) for name, lib in cpu_cols if lib not in floors]
        # Against flowengine's own transports' floor too, when it ran: the
        # part of a task that is the engine's, not the messages'.
        fe_ratio_cols = ratio_cols if "floor-fe" in libs else []
        print(
            "| transport | "
            + " | ".join(name for name, _ in cpu_cols)
            + "".join(f" | {name}/floor" for name, _ in ratio_cols)
            + "".join(f" | {name}/floor fe" for name, _ in fe_ratio_cols)
            + " |",
            file=out,
        )
        print("|---" * (len(cpu_cols) + len(ratio_cols) + len(fe_ratio_cols) + 1) + "|", file=out)
        for t in transports:
            floor_cpu = med(t, "floor", "floor", "cpu_per_task_ms")
            floor_fe_cpu = med(t, "floor-fe", "floor", "cpu_per_task_ms")
            if floor_fe_cpu is None and t not in FLOOR_FE_TRANSPORTS:
                floor_fe_cpu = floor_cpu  # the floor runs on flowengine's transport here
            cells = [
                cell(t, lib, "floor", "cpu_per_task_ms")
                if lib in floors
                else cell(t, lib, "latency", "steady_cpu_per_task_ms")
                for _, lib in cpu_cols
            ]
            ratios = [
                _ratio(med(t, lib, "latency", "steady_cpu_per_task_ms"), base)
                for base, cols in ((floor_cpu, ratio_cols), (floor_fe_cpu, fe_ratio_cols))
                for _, lib in cols
            ]
            print(f"| {t} | " + " | ".join(cells + ratios) + " |", file=out)
        print(
            "(memory: the workers are threads of the engine process, so their CPU is in"
            " too; elsewhere the engine's side only. floor fe: the floor's client and"
            " server on flowengine's Redis and AMQP transports; on memory and filesystem"
            " the floor runs on flowengine's transports anyway)",
            file=out,
        )
        print(
            "\nContext switches per task, steady (the engine process's threads, voluntary"
            " and involuntary, from the first completion to the last of the 50-task flow;"
            " floor: the client's per round trip)",
            file=out,
        )
        print("| transport | " + " | ".join(name for name, _ in cpu_cols) + " |", file=out)
        print("|---" * (len(cpu_cols) + 1) + "|", file=out)
        for t in transports:
            cells = [
                cell(t, lib, "floor", "switches_per_task")
                if lib in floors
                else cell(t, lib, "latency", "steady_switches_per_task")
                for _, lib in cpu_cols
            ]
            print(f"| {t} | " + " | ".join(cells) + " |", file=out)
        print("(memory: the workers' threads (the floor's server) included, as for CPU)", file=out)

    print(
        f"\nOne-task run (ms): a fresh engine's run() of a 1-task flow, workers up"
        f" (median of {ONE_TASK_RUNS} engines per repetition; Dramatiq: a fresh client's"
        " connect, send and result)",
        file=out,
    )
    one_cols = [(lib, lib, "run_ms") for lib in ("flowengine", "flowengine-base") if lib in libs]
    if "flowengine" in libs:
        one_cols.append(("flowengine shared", "flowengine", "shared_run_ms"))
    if "dramatiq" in libs:
        one_cols.append(("dramatiq", "dramatiq", "run_ms"))
    print(
        "| transport | "
        + " | ".join(c[0] for c in one_cols)
        + " | fe/Dramatiq | fe shared/Dramatiq |",
        file=out,
    )
    print("|---" * (len(one_cols) + 3) + "|", file=out)
    for t in transports:
        dra = med(t, "dramatiq", "one-task", "run_ms")
        own = med(t, "flowengine", "one-task", "run_ms")
        shared = med(t, "flowengine", "one-task", "shared_run_ms")
        print(
            f"| {t} | "
            + " | ".join(cell(t, lib, "one-task", key) for _, lib, key in one_cols)
            + f" | {_ratio(own, dra)} | {_ratio(shared, dra)} |",
            file=out,
        )
    print(
        "(flowengine shared: engines with shared=True, the first of which starts the"
        " executor the others find up)",
        file=out,
    )

    print(
        f"\nThroughput, {THROUGHPUT_TASKS} independent tasks on {WORKERS} workers x"
        f" {WORKER_THREADS} threads (tasks/s, engine start or first send to last"
        " result; higher is better)",
        file=out,
    )
    tcols = [("flowengine", "flowengine")]
    if "flowengine-base" in libs:
        tcols.append(("fe base", "flowengine-base"))
    if "flowengine-late" in libs:
        tcols.append(("fe late", "flowengine-late"))
    tcols += [
        ("Celery 5.7", "celery"),
        ("Dramatiq 2.2", "dramatiq"),
        ("TF tuned", "taskflow-tuned"),
        ("TF default", "taskflow-default"),
    ]
    print(
        "| transport | "
        + " | ".join(c[0] for c in tcols)
        + " | fe/Celery | base/Celery | fe/Dramatiq | fe/TF tuned | fe steady |",
        file=out,
    )
    print("|---" * (len(tcols) + 6) + "|", file=out)
    for t in transports:
        fe = med(t, "flowengine", "throughput", "run_tasks_per_s")
        base = med(t, "flowengine-base", "throughput", "run_tasks_per_s")
        cel = med(t, "celery", "throughput", "run_tasks_per_s")
        dra = med(t, "dramatiq", "throughput", "run_tasks_per_s")
        tt = med(t, "taskflow-tuned", "throughput", "run_tasks_per_s")
        cells = [cell(t, lib, "throughput", "run_tasks_per_s") for _, lib in tcols]
        print(
            f"| {t} | "
            + " | ".join(cells)
            + f" | {_ratio(fe, cel)} | {_ratio(base, cel)} | {_ratio(fe, dra)} | {_ratio(fe, tt)}"
            f" | {cell(t, 'flowengine', 'throughput', 'tasks_per_s')} |",
            file=out,
        )
    print("(fe steady: first to last completion, the engine's start left out)", file=out)
    errors = [r for r in results if "error" in r]
    for r in errors:
        print(f"# {r['transport']} {r['lib']} {r['case']}: {r['error']}", file=out)


def _cases(lib: str, tiny: bool) -> list[tuple[str, int]]:
    if lib == "floor":
        trips = 20 if tiny else FLOOR_ROUND_TRIPS
        return [("floor", trips), (FLOOR_3, trips)]
    if lib == "floor-fe":
        return [("floor", 20 if tiny else FLOOR_ROUND_TRIPS)]
    if tiny:
        cases = [("latency", 5), ("throughput", 20)]
    elif lib == "taskflow-default":
        cases = [
            ("latency", DEFAULT_TASKFLOW_LATENCY_TASKS),
            ("throughput", DEFAULT_TASKFLOW_THROUGHPUT_TASKS),
        ]
    else:
        cases = [("latency", LATENCY_TASKS), ("throughput", THROUGHPUT_TASKS)]
    if lib in ("flowengine", "flowengine-base"):
        cases.append(("one-task", 1))
    if lib == "dramatiq":
        cases.append(("one-task", ONE_TASK_RUNS))
    if lib == "flowengine":
        cases.append(("serial", 5 if tiny else LATENCY_TASKS))
    return cases


def _shown(r: dict) -> str:
    if "error" in r:
        return r["error"]
    if "run_ms" in r:
        return f"run() {r['run_ms']:.1f} ms (median of {len(r['runs_ms'])})"
    parts = [f"{r['per_task_ms']:.2f} ms/task"] if "per_task_ms" in r else []
    if "run_tasks_per_s" in r:
        parts.append(f"{r['run_tasks_per_s']:.0f} tasks/s from start")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    global BASELINE_TREE
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        action="append",
        help="transport to run (repeatable; default: all)",
    )
    p.add_argument(
        "--lib",
        choices=LIBS,
        action="append",
        help="library to run (repeatable; default: all but flowengine-base, which --baseline"
        " adds to any list)",
    )
    p.add_argument(
        "--baseline",
        metavar="TREE",
        help="another flowengine source tree (e.g. a worktree of main), run as"
        " 'flowengine-base' next to this one",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=REPEAT,
        help="repetitions of each case, interleaved (default %(default)s)",
    )
    p.add_argument("--redis-url", help="use this Redis instead of starting one")
    p.add_argument("--amqp-url", help="use this RabbitMQ instead of starting one")
    p.add_argument("--tiny", action="store_true", help="tiny flows (a smoke test)")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument(
        "--cpu",
        type=int,
        metavar="N",
        help="run every case (engine, workers, floor server; not the broker)"
        " on CPU N only: steadier figures for telling two trees apart,"
        " not comparable with unpinned ones",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=CASE_TIMEOUT_S,
        help="seconds allowed per case (default %(default)s)",
    )
    p.add_argument("--taskflow-venv", default=bench_core.TASKFLOW_VENV)
    p.add_argument("--taskflow-spec", default=bench_core.TASKFLOW_SPEC)
    # Child roles (internal).
    p.add_argument("--role", choices=("case", "worker", "floor-server"), help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--exchange", help=argparse.SUPPRESS)
    p.add_argument("--conn", type=json.loads, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.role == "worker":
        return worker_main(args.lib[0], args.exchange, args.conn)
    if args.role == "floor-server":
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *a: stop.set())
        floor_server(args.exchange, args.conn, stop=stop, replies=args.n or 1)
        return 0
    if args.role == "case":
        if args.cpu is not None:
            # Before any thread or process starts: they inherit it.
            os.sched_setaffinity(0, {args.cpu})
        lib, transport = args.lib[0], args.transport[0]
        if args.case in ("floor", FLOOR_3):
            result = floor_case(
                transport, args.conn, args.n, replies=2 if args.case == FLOOR_3 else 1
            )
        else:
            result = flow_case(lib, args.case, args.n, transport, args.conn)
        result["cpus"] = sorted(os.sched_getaffinity(0))
        print(json.dumps(result))
        # Daemon threads of TaskFlow's in-process workers may linger; done is done.
        sys.stdout.flush()
        os._exit(0)

    if args.cpu is not None and args.cpu not in os.sched_getaffinity(0):
        p.error(
            f"--cpu {args.cpu}: not one of the CPUs this process may use"
            f" ({sorted(os.sched_getaffinity(0))})"
        )
    if args.baseline:
        BASELINE_TREE = os.path.abspath(args.baseline)
    transports = args.transport or list(TRANSPORTS)
    libs = list(args.lib or DEFAULT_LIBS)
    if args.baseline and "flowengine-base" not in libs:
        # The tree given is to be measured, with or without an explicit --lib list.
        libs.append("flowengine-base")
    pythons = {lib: sys.executable for lib in libs}
    if any(lib.startswith("taskflow") for lib in libs):
        tf = taskflow_python(args.taskflow_venv, args.taskflow_spec)
        pythons.update({lib: tf for lib in libs if lib.startswith("taskflow")})
    if "celery" in libs:
        import bench_celery

        pythons["celery"] = bench_celery.ensure_celery_python()
    if "dramatiq" in libs:
        import bench_dramatiq

        pythons["dramatiq"] = bench_dramatiq.ensure_dramatiq_python()
    print(
        f"# python {platform.python_version()}, {os.cpu_count()} CPUs; each case in a"
        " fresh subprocess",
        file=sys.stderr,
    )
    results = []
    hung: set[tuple[str, str, str]] = set()
    given = {"redis": args.redis_url, "amqp": args.amqp_url}
    needed = [t for t in transports if not given.get(t)]
    if "dramatiq" in libs and "amqp" in transports and "redis" not in needed and not given["redis"]:
        needed.append("redis")  # Dramatiq's results, on RabbitMQ too
    with broker_urls(needed) as urls:
        urls.update({k: v for k, v in given.items() if v})
        for rep in range(args.repeat):
            for transport in transports:
                if transport not in urls:
                    continue
                for lib in libs:
                    if lib in PEERS and transport not in CELERY_TRANSPORTS:
                        continue
                    if lib == "floor-fe" and transport not in FLOOR_FE_TRANSPORTS:
                        continue
                    if lib == "taskflow-default" and rep >= TASKFLOW_DEFAULT_REPEAT:
                        continue
                    for case, n in _cases(lib, args.tiny):
                        if (transport, lib, case) in hung:
                            continue  # timed out once: it would again
                        timeout = args.timeout
                        if lib.startswith("taskflow") and transport == "filesystem":
                            timeout = min(timeout, TASKFLOW_FILESYSTEM_TIMEOUT_S)
                        r = run_case(
                            pythons[lib],
                            lib,
                            case,
                            transport,
                            urls[transport],
                            n,
                            timeout,
                            args.cpu,
                            results_url=urls.get("redis"),
                        )
                        r["rep"] = rep
                        results.append(r)
                        if r.get("error", "").startswith("timeout"):
                            hung.add((transport, lib, case))
                        print(
                            f"# {rep} {transport:<10} {lib:<16} {case:<10} n={n:<4} {_shown(r)}",
                            file=sys.stderr,
                            flush=True,
                        )
    if args.cpu is not None:
        print(
            f"\nEvery case ran on CPU {args.cpu} only (--cpu; the brokers did not):"
            " compare these figures with pinned runs only."
        )
    print_table(results)
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if any("error" in r for r in results if r["lib"] in ("flowengine", "floor")) else 0


if __name__ == "__main__":
    sys.exit(main())
