#!/usr/bin/env python3
"""Jobboard throughput: jobs/s from post to consumed, flowengine's boards next to TaskFlow's.

Each measurement is one child process (flowengine's interpreter, or the
cached TaskFlow 6.5 virtualenv of ``bench_core.py``) that starts one
blocking conductor on a fresh board, posts ``--jobs`` jobs of a one-task
flow (logbooks in memory persistence) and waits until the conductor has
consumed them all; jobs/s = jobs / (last consumed - first posted). Redis
and ZooKeeper are started once by ``tests/brokers.py`` on loopback ports
and shared by both libraries in the same run; flowengine's SQL board runs
on a SQLite file. Reported: the median of ``--repeat`` runs (at least 5)
per board, and flowengine / TaskFlow ratios of the medians.

    python tools/bench/bench_jobs.py                    # everything, 5 repetitions
    python tools/bench/bench_jobs.py --jobs 50 --repeat 5 --lib flowengine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench_core  # noqa: E402  (the cached TaskFlow virtualenv)

#: Jobs per measurement: enough that start-up is noise, few enough for a
#: full run (5 boards x 5 repetitions) in a few minutes on 2 cores.
JOBS = 200
#: Repetitions per board (the brief's floor: medians of at least 5).
REPEAT = 5
#: A run that takes longer than this is reported as failed, not waited for.
RUN_TIMEOUT_S = 300.0
#: (library, board) pairs measured, in table order.
BOARDS = (
    ("flowengine", "redis"),
    ("flowengine", "zookeeper"),
    ("flowengine", "sqlite"),
    ("taskflow", "redis"),
    ("taskflow", "zookeeper"),
)


def trivial_flow():
    """The flow every job runs: one task that does nothing."""
    lib = __import__(os.environ["BENCH_JOBS_LIB"])
    task = __import__(f"{lib.__name__}.task", fromlist=["task"])
    lf = __import__(f"{lib.__name__}.patterns.linear_flow", fromlist=["linear_flow"])

    class Nothing(task.Task):
        def execute(self):
            return None

    return lf.Flow("bench").add(Nothing("nothing"))


def _board_conf(lib: str, kind: str, where: str, tag: str) -> dict:
    if kind == "redis":
        host, port = where.rsplit("/", 1)[0].split("//", 1)[1].split(":")
        return {"board": "redis", "host": host, "port": int(port), "namespace": f"bench-{tag}"}
    if kind == "zookeeper":
        return {
            "board": "zookeeper",
            "hosts": where.split("//", 1)[1],
            "path": f"/bench-{lib}/{tag}",
        }
    return {"board": where + f"?namespace=bench{tag}"}


def child(lib: str, kind: str, where: str, jobs: int) -> dict:
    """Run one measurement in this process; the numbers as a dict."""
    os.environ["BENCH_JOBS_LIB"] = lib
    mod = __import__(lib)
    conductors = __import__(f"{lib}.conductors.backends", fromlist=["backends"])
    engines = __import__(f"{lib}.engines", fromlist=["engines"])
    boards = __import__(f"{lib}.jobs.backends", fromlist=["backends"])
    memory = __import__(f"{lib}.persistence.backends.impl_memory", fromlist=["impl_memory"])
    p_utils = __import__(f"{lib}.utils.persistence_utils", fromlist=["persistence_utils"])
    persistence = memory.MemoryBackend({})
    board = boards.fetch(
        "bench", _board_conf(lib, kind, where, uuid.uuid4().hex[:10]), persistence=persistence
    )
    board.connect()
    conductor = conductors.fetch(
        "blocking", "bench-conductor", board, persistence=persistence, engine="serial"
    )
    done = threading.Event()
    consumed = []

    def on_consumed(_event, details):
        consumed.append(time.monotonic())
        if len(consumed) >= jobs:
            done.set()

    conductor.notifier.register("job_consumed", on_consumed)
    runner = threading.Thread(target=conductor.run, daemon=True)
    runner.start()
    started = time.monotonic()
    for i in range(jobs):
        book, fd = p_utils.temporary_flow_detail(persistence)
        engines.save_factory_details(fd, trivial_flow, [], {}, backend=persistence)
        board.post(f"job-{i}", book, details={"flow_uuid": fd.uuid})
    posted = time.monotonic()
    finished = done.wait(RUN_TIMEOUT_S)
    conductor.stop()
    runner.join(30)
    board.close()
    elapsed = (consumed[-1] if consumed else time.monotonic()) - started
    return {
        "lib": lib,
        "board": kind,
        "jobs": jobs,
        "consumed": len(consumed),
        "ok": finished,
        "post_s": posted - started,
        "elapsed_s": elapsed,
        "jobs_per_s": len(consumed) / elapsed if elapsed > 0 else 0.0,
        "version": getattr(mod, "__version__", "?"),
    }


def _measure(python: str, lib: str, kind: str, where: str, jobs: int) -> dict:
    env = dict(os.environ)
    if lib == "flowengine":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [python, os.path.abspath(__file__), "--child", lib, kind, where, str(jobs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_TIMEOUT_S + 60,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"lib": lib, "board": kind, "ok": False, "error": proc.stderr[-2000:]}
    return json.loads(lines[-1])


def _table(results: dict[tuple[str, str], list[dict]]) -> str:
    medians = {
        key: statistics.median(r["jobs_per_s"] for r in runs)
        for key, runs in results.items()
        if runs and all(r.get("ok") for r in runs)
    }
    out = [
        "| board | flowengine jobs/s | TaskFlow 6.5 jobs/s | flowengine / TaskFlow |",
        "|---|---:|---:|---:|",
    ]
    for kind in ("redis", "zookeeper", "sqlite"):
        fe, tf = medians.get(("flowengine", kind)), medians.get(("taskflow", kind))
        ratio = f"{fe / tf:.2f}x" if fe and tf else "-"
        out.append(f"| {kind} | {fe:.1f} | " if fe else f"| {kind} | - | ")
        none = "- (TaskFlow has no SQL board)" if kind == "sqlite" else "-"
        out[-1] += f"{tf:.1f} | {ratio} |" if tf else f"{none} | {ratio} |"
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=JOBS, help="jobs per run (%(default)s)")
    p.add_argument("--repeat", type=int, default=REPEAT, help="runs per board (%(default)s)")
    p.add_argument("--lib", action="append", choices=("flowengine", "taskflow"))
    p.add_argument("--board", action="append", choices=("redis", "zookeeper", "sqlite"))
    p.add_argument("--json", action="store_true", help="also print every run as JSON")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        lib, kind, where, jobs = args.child
        print(json.dumps(child(lib, kind, where, int(jobs))), flush=True)
        return 0
    if args.repeat < 5:
        p.error("--repeat must be at least 5 (medians of fewer runs are noise)")
    wanted = [
        (lib, kind)
        for lib, kind in BOARDS
        if (not args.lib or lib in args.lib) and (not args.board or kind in args.board)
    ]
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    import brokers

    pythons = {"flowengine": sys.executable}
    if any(lib == "taskflow" for lib, _ in wanted):
        pythons["taskflow"] = bench_core.ensure_taskflow_python(
            bench_core.TASKFLOW_VENV, "taskflow==6.5.0"
        )
        for module in ("kazoo", "redis"):  # TaskFlow's boards' optional clients
            if not bench_core._can_import(pythons["taskflow"], module):
                subprocess.run(
                    [pythons["taskflow"], "-m", "pip", "install", "-q", module], check=True
                )
    results: dict[tuple[str, str], list[dict]] = {key: [] for key in wanted}
    with (
        brokers.running_redis() as redis_srv,
        brokers.running_zookeeper() as zk_srv,
        tempfile.TemporaryDirectory() as tmp,
    ):
        where = {
            "redis": redis_srv.url,
            "zookeeper": zk_srv.url,
            "sqlite": f"sqlite:///{tmp}/jobs.db",
        }
        for rep in range(args.repeat):  # interleaved: drift hits every board alike
            for lib, kind in wanted:
                run = _measure(pythons[lib], lib, kind, where[kind], args.jobs)
                results[(lib, kind)].append(run)
                shown = f"{run['jobs_per_s']:.1f} jobs/s" if run.get("ok") else "FAILED"
                print(
                    f"# run {rep + 1}/{args.repeat} {lib:10} {kind:9} {shown}",
                    file=sys.stderr,
                    flush=True,
                )
                if not run.get("ok"):
                    print(run.get("error", ""), file=sys.stderr)
    print(
        f"\njobs/s, post -> consumed, {args.jobs} one-task jobs, one blocking conductor,"
        f" median of {args.repeat} runs (same Redis / ZooKeeper servers for both)\n"
    )
    print(_table(results))
    if args.json:
        print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}, indent=1))
    return 0 if all(r.get("ok") for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
