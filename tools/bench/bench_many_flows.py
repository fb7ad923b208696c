#!/usr/bin/env python3
"""Many flows at once: one process runs 1,000 concurrent flows of 10 remote tasks each.

The conductor's situation: one engine process holding many flows at the same
time, their tasks run by worker processes. For flowengine and TaskFlow 6.5
in the same run, per broker (Redis, RabbitMQ; started by this script on
loopback with ``tests/brokers.py``, or given with ``--redis-url`` and
``--amqp-url``), each measurement a fresh engine process that:

1. starts ``WORKERS`` worker processes of its library (``WORKER_THREADS``
   threads each, the same workers as ``bench_remote.py``);
2. runs one flow alone (warm-up: imports and first connections out of the
   figures), then notes its resident memory, threads and open files;
3. starts ``--flows`` threads, each loading a worker-based engine for its
   own linear flow of ``--tasks`` trivial tasks and calling ``run()`` on it:
   what a user of either library does today to run flows concurrently (one
   thread per ``engine.run()``);
4. samples its threads, open files and resident memory every
   ``SAMPLE_PERIOD_S`` while the flows run, and its peak resident memory
   (the kernel's high-water mark) at the end.

Figures: wall time from the first thread's start to the last one's end,
tasks per second over it, CPU time of the engine process per task, peak RSS,
and per flow (at the sample with the most threads): threads, open files
(sockets, pipes) and memory above the warm-up's, divided by the flows alive
then. Only what the process shows from outside is read (``/proc/self``), so
the bench measures whatever the library does and can be re-run unchanged
after a change to how engines share connections.

TaskFlow runs from ``bench_core.py``'s cached virtualenv (kombu and redis
added, as ``bench_remote.py`` does); it is never a dependency of flowengine.

Usage::

    python tools/bench/bench_many_flows.py      # 1,000 x 10, both libs and brokers, 5 reps
    python tools/bench/bench_many_flows.py --transport redis --flows 20 --tasks 2 --repeat 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_core  # noqa: E402  (the cached TaskFlow virtualenv)
import bench_remote  # noqa: E402  (workers, brokers, connection settings)

LIBS = ("flowengine", "flowengine-shared", "taskflow")
#: Engine options of each library's engines: ``flowengine-shared`` is
#: flowengine with every engine of the process on one shared executor.
ENGINE_OPTIONS = {"flowengine-shared": {"shared": True}}
TRANSPORTS = ("redis", "amqp")

#: Concurrent flows, tasks per flow and repetitions by default (the issue's case).
FLOWS = 1000
TASKS = 10
REPEAT = 5

#: How often the engine process samples its threads, files and memory (s):
#: often enough to catch the peak of a run of several seconds, rarely enough
#: that reading /proc costs the flows nothing measurable.
SAMPLE_PERIOD_S = 0.05

#: Seconds the flows of one measurement get before those still running are
#: counted as hung (and the measurement ends without them).
RUN_DEADLINE_S = 600.0

#: Seconds one measurement may take beyond its flows' deadline (worker
#: start, warm-up, the engine process's exit).
CASE_MARGIN_S = 300.0

#: Connections kombu's pool may hold beyond two per TaskFlow engine.
KOMBU_POOL_SPARE = 10

#: Flow errors quoted in a result (the count is always given).
ERRORS_QUOTED = 3


# --------------------------------------------------------------------------
# the engine process (child side)
# --------------------------------------------------------------------------


def _status() -> dict[str, int]:
    """Threads, resident and peak resident memory (kB) of this process, from /proc."""
    wanted = {"Threads:": "threads", "VmRSS:": "rss_kb", "VmHWM:": "hwm_kb"}
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition("\t")
            name = wanted.get(key)
            if name:
                got[name] = int(value.split()[0])
    return got


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


class Sampler:
    """Samples this process every SAMPLE_PERIOD_S; keeps the sample with the most threads.

    ``alive()`` tells how many flows are alive at a sample, so that what a
    flow costs is read where the most of them were running.
    """

    def __init__(self, alive) -> None:
        self._alive = alive
        self._stop = threading.Event()
        self.peak: dict[str, int] = {"threads": 0}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def take(self) -> None:
        """One sample now (also called by the thread that starts the flows, once all started).

        Open files are counted only at a new peak of threads: listing
        thousands of descriptors every period would cost the flows CPU.
        """
        sample = {**_status(), "flows": self._alive()}
        with self._lock:
            if sample["threads"] > self.peak["threads"]:
                self.peak = {**sample, "files": _open_files()}

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_PERIOD_S):
            self.take()


def _flow(lib: str, tasks: int):
    import bench_remote_tasks

    if lib == "taskflow":
        from taskflow.patterns import linear_flow
    else:
        from flowengine.patterns import linear_flow
    return linear_flow.Flow("many").add(*[bench_remote_tasks.Noop(f"t{i}") for i in range(tasks)])


def _run_one(lib: str, tasks: int, exchange: str, conn: dict) -> None:
    """What a user's thread does: load a worker-based engine for its flow and run it."""
    if lib == "taskflow":
        from taskflow import engines
    else:
        from flowengine import engines
    engine = engines.load(
        _flow(lib, tasks),
        engine="worker-based",
        exchange=exchange,
        topics=[bench_remote.TOPIC],
        **conn,
        **ENGINE_OPTIONS.get(lib, {}),
    )
    engine.run()


def _widen_kombu_pools(flows: int) -> None:
    """Let kombu's process-wide connection pool hold what ``flows`` TaskFlow engines take.

    Each TaskFlow worker-based engine holds a connection from kombu's pool
    for its consumer as long as it runs and takes another for each
    publication; the pool's default limit (10) makes the eleventh
    concurrent engine wait forever (measured: 20 concurrent flows never
    end). A TaskFlow user running many flows in one process must raise it
    the same way (kombu's public ``set_limit``); connections are still
    made only when needed.
    """
    import kombu.pools

    kombu.pools.set_limit(2 * flows + KOMBU_POOL_SPARE)


def many_flows_case(
    lib: str, flows: int, tasks: int, conn: dict, run_deadline_s: float = RUN_DEADLINE_S
) -> dict:
    """The measurement itself (see the module's docstring), workers included."""
    # A process running a thousand engines may need more descriptors than a
    # shell's default soft limit; the hard limit is the machine's to give.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if lib == "taskflow":
        _widen_kombu_pools(flows)
    exchange = f"many-{uuid.uuid4().hex[:8]}"
    worker_lib = "taskflow-default" if lib == "taskflow" else "flowengine"
    with bench_remote.worker_processes(worker_lib, exchange, conn, bench_remote.WORKERS):
        _run_one(lib, tasks, exchange, conn)  # warm-up
        alive = 0
        alive_lock = threading.Lock()
        errors: list[str] = []
        ends: dict[str, float] = {}

        def user_thread() -> None:
            nonlocal alive
            with alive_lock:
                alive += 1
            try:
                _run_one(lib, tasks, exchange, conn)
            except Exception as e:  # reported with the figures, not raised
                errors.append(f"{type(e).__name__}: {e}")
            finally:
                ends[threading.current_thread().name] = time.perf_counter()
                with alive_lock:
                    alive -= 1

        sampler = Sampler(lambda: alive)
        sampler.start()
        base = {**_status(), "files": _open_files()}
        threads = [
            threading.Thread(target=user_thread, name=f"flow-{i}", daemon=True)
            for i in range(flows)
        ]
        cpu = time.process_time()
        started = time.perf_counter()
        for t in threads:
            t.start()
        sampler.take()  # at least one sample with the flows started, however short they are
        deadline = started + run_deadline_s
        last_end = started
        for t in threads:
            t.join(max(0.0, deadline - time.perf_counter()))
            if not t.is_alive():
                last_end = max(last_end, ends.get(t.name, started))
        hung = sum(1 for t in threads if t.is_alive())
        wall_s = (deadline - started) if hung else (last_end - started)
        cpu = time.process_time() - cpu
        # Read before the sampler ends, so that it counts in both this and base.
        end = {**_status(), "files": _open_files()}
        sampler.stop()
    peak = sampler.peak
    at_peak = max(peak.get("flows", 0), 1)
    done = flows - len(errors) - hung
    return {
        "flows": flows,
        "tasks": tasks,
        "failed_flows": len(errors),
        "hung_flows": hung,
        "errors": errors[:ERRORS_QUOTED],
        "wall_s": wall_s,
        "tasks_per_s": done * tasks / wall_s,
        "cpu_per_task_ms": cpu / (flows * tasks) * 1000.0,
        "base_rss_mb": base["rss_kb"] / 1024.0,
        "peak_rss_mb": end["hwm_kb"] / 1024.0,
        "base_threads": base["threads"],
        "peak_threads": peak["threads"],
        "flows_at_peak": peak.get("flows", 0),
        "threads_per_flow": (peak["threads"] - base["threads"]) / at_peak,
        "files_at_peak": peak.get("files", 0),
        "files_per_flow": (peak.get("files", base["files"]) - base["files"]) / at_peak,
        # What the ended flows left behind (threads still running, files open).
        "threads_left": end["threads"] - base["threads"],
        "files_left": end["files"] - base["files"],
        # The high-water mark may fall on another sample than the most
        # threads; divided by the flows alive at the most threads.
        "rss_per_flow_kb": (end["hwm_kb"] - base["rss_kb"]) / at_peak,
    }


# --------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------


def run_case(
    python: str, lib: str, transport: str, url: str, flows: int, tasks: int, deadline_s: float
) -> dict:
    """One measurement in a fresh engine process of ``python``; its result or an error.

    The flows get ``deadline_s``; the whole process that plus CASE_MARGIN_S.
    """
    timeout_s = deadline_s + CASE_MARGIN_S
    base = {"lib": lib, "transport": transport}
    conn = bench_remote.connection(lib, transport, url, None)
    cmd = [
        python,
        os.path.abspath(__file__),
        "--role",
        "case",
        "--lib",
        lib,
        "--flows",
        str(flows),
        "--tasks",
        str(tasks),
        "--deadline",
        str(deadline_s),
        "--conn",
        json.dumps(conn),
    ]
    env = bench_remote._lib_env("taskflow-default" if lib == "taskflow" else "flowengine")
    # A session of its own: a measurement that times out is killed with its workers.
    child = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=HERE,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, 9)
        child.communicate()
        return {**base, "error": f"timeout after {timeout_s:.0f} s"}
    if child.returncode != 0:
        last = (stderr.strip().splitlines() or ["?"])[-1]
        return {**base, "error": f"exit {child.returncode}: {last}"}
    return {**base, **json.loads(stdout.strip().splitlines()[-1])}


def _stat(results: list[dict], transport: str, lib: str, key: str) -> tuple | None:
    values = [
        float(r[key])
        for r in results
        if r["transport"] == transport and r["lib"] == lib and "error" not in r
    ]
    if not values:
        return None
    return bench_remote._median(values), min(values), max(values), len(values)


def _cell(got: tuple | None, digits: int = 0) -> str:
    if got is None:
        return "-"
    m, lo, hi, count = got
    if count == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


#: Table columns: header, result key, decimals.
COLUMNS = (
    ("wall s", "wall_s", 1),
    ("tasks/s", "tasks_per_s", 0),
    ("CPU ms/task", "cpu_per_task_ms", 2),
    ("peak RSS MB", "peak_rss_mb", 0),
    ("RSS/flow kB", "rss_per_flow_kb", 0),
    ("threads at peak", "peak_threads", 0),
    ("flows then", "flows_at_peak", 0),
    ("threads/flow", "threads_per_flow", 2),
    ("files/flow", "files_per_flow", 2),
    ("threads left", "threads_left", 0),
    ("failed flows", "failed_flows", 0),
    ("hung flows", "hung_flows", 0),
)

#: Ratio columns (flowengine / TaskFlow): header, result key.
RATIOS = (
    ("tasks/s", "tasks_per_s"),
    ("wall", "wall_s"),
    ("CPU/task", "cpu_per_task_ms"),
    ("peak RSS", "peak_rss_mb"),
    ("RSS/flow", "rss_per_flow_kb"),
    ("threads/flow", "threads_per_flow"),
    ("files/flow", "files_per_flow"),
)


def print_table(results: list[dict], flows: int, tasks: int, out=sys.stdout) -> None:
    """Medians [min-max] per transport and library, then flowengine / TaskFlow ratios."""
    reps = max(
        (
            sum(1 for r in results if r["transport"] == t and r["lib"] == lib)
            for t in TRANSPORTS
            for lib in LIBS
        ),
        default=0,
    )
    print(
        f"\n{flows} concurrent flows x {tasks} remote tasks in one process, one thread per"
        f" run(), {bench_remote.WORKERS} worker processes x {bench_remote.WORKER_THREADS}"
        f" threads; median [min-max] of up to {reps} repetitions",
        file=out,
    )
    print("| transport | lib | " + " | ".join(c[0] for c in COLUMNS) + " |", file=out)
    print("|---" * (len(COLUMNS) + 2) + "|", file=out)
    transports = [t for t in TRANSPORTS if any(r["transport"] == t for r in results)]
    for t in transports:
        for lib in LIBS:
            if not any(r["transport"] == t and r["lib"] == lib for r in results):
                continue
            cells = [_cell(_stat(results, t, lib, key), digits) for _, key, digits in COLUMNS]
            print(f"| {t} | {lib} | " + " | ".join(cells) + " |", file=out)
    print(
        "(threads/flow, files/flow: above the warm-up's, at the sample with the most"
        " threads, divided by the flows alive then (one user thread each); RSS/flow:"
        " peak RSS above the warm-up's, divided by the same; threads left: still running"
        " once every run() returned)",
        file=out,
    )
    print("\nflowengine / TaskFlow (medians)", file=out)
    print("| transport | lib | " + " | ".join(r[0] for r in RATIOS) + " |", file=out)
    print("|---" * (len(RATIOS) + 2) + "|", file=out)
    for t in transports:
        for lib in ("flowengine", "flowengine-shared"):
            if not any(r["transport"] == t and r["lib"] == lib for r in results):
                continue
            cells = []
            for _, key in RATIOS:
                fe, tf = _stat(results, t, lib, key), _stat(results, t, "taskflow", key)
                cells.append(bench_remote._ratio(fe and fe[0], tf and tf[0]))
            print(f"| {t} | {lib} | " + " | ".join(cells) + " |", file=out)
    for r in results:
        if "error" in r:
            print(f"# {r['transport']} {r['lib']}: {r['error']}", file=out)
        for e in r.get("errors", []):
            print(f"# {r['transport']} {r['lib']} flow error: {e}", file=out)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transport", choices=TRANSPORTS, action="append", help="default: both")
    p.add_argument("--lib", choices=LIBS, action="append", help="default: both")
    p.add_argument(
        "--flows", type=int, default=FLOWS, help="concurrent flows (default %(default)s)"
    )
    p.add_argument("--tasks", type=int, default=TASKS, help="tasks per flow (default %(default)s)")
    p.add_argument(
        "--repeat", type=int, default=REPEAT, help="repetitions, interleaved (default %(default)s)"
    )
    p.add_argument("--redis-url", help="use this Redis instead of starting one")
    p.add_argument("--amqp-url", help="use this RabbitMQ instead of starting one")
    p.add_argument(
        "--deadline",
        type=float,
        default=RUN_DEADLINE_S,
        help="seconds the flows get before those still running count as hung (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument("--taskflow-venv", default=bench_core.TASKFLOW_VENV)
    p.add_argument("--taskflow-spec", default=bench_core.TASKFLOW_SPEC)
    p.add_argument("--role", choices=("case",), help=argparse.SUPPRESS)
    p.add_argument("--conn", type=json.loads, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.role == "case":
        result = many_flows_case(args.lib[0], args.flows, args.tasks, args.conn, args.deadline)
        print(json.dumps(result))
        sys.stdout.flush()
        os._exit(0)  # engines' daemon threads that linger must not hold the exit

    transports = args.transport or list(TRANSPORTS)
    libs = args.lib or list(LIBS)
    pythons = {"flowengine": sys.executable, "flowengine-shared": sys.executable}
    if "taskflow" in libs:
        pythons["taskflow"] = bench_remote.taskflow_python(args.taskflow_venv, args.taskflow_spec)
    print(
        f"# python {platform.python_version()}, {os.cpu_count()} CPUs; {args.flows} flows x"
        f" {args.tasks} tasks; each measurement in a fresh process",
        file=sys.stderr,
    )
    results = []
    given = {"redis": args.redis_url, "amqp": args.amqp_url}
    with bench_remote.broker_urls([t for t in transports if not given.get(t)]) as urls:
        urls.update({k: v for k, v in given.items() if v})
        for rep in range(args.repeat):
            for transport in transports:
                if not urls.get(transport):
                    continue
                for lib in libs:
                    r = run_case(
                        pythons[lib],
                        lib,
                        transport,
                        urls[transport],
                        args.flows,
                        args.tasks,
                        args.deadline,
                    )
                    r["rep"] = rep
                    results.append(r)
                    shown = r.get("error") or (
                        f"{r['wall_s']:.1f} s, {r['tasks_per_s']:.0f} tasks/s, peak RSS"
                        f" {r['peak_rss_mb']:.0f} MB, {r['peak_threads']} threads,"
                        f" {r['failed_flows']} failed, {r['hung_flows']} hung"
                    )
                    print(f"# {rep} {transport:<6} {lib:<10} {shown}", file=sys.stderr, flush=True)
    print_table(results, args.flows, args.tasks)
    if args.json:
        print(json.dumps(results, indent=1))
    bad = [
        r
        for r in results
        if r["lib"] != "taskflow" and ("error" in r or r["failed_flows"] or r["hung_flows"])
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
