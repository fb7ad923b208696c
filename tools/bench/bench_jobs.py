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

``--scaling`` measures jobs/s against the number of conductor processes
instead (1, 2, 4, 8 by default; ``--conductors``) on the Redis, ZooKeeper
and PostgreSQL boards: each conductor is a child process holding the same
logbooks in its own memory persistence (uuids derived from the run's tag,
so any conductor can load any job); the first child posts all ``--jobs``
jobs, then every conductor starts at one signal and jobs/s = jobs / (last
consumed - signal). PostgreSQL is started as the tests start it
(``tests/persistence/pg_server.py``).

    python tools/bench/bench_jobs.py                    # everything, 5 repetitions
    python tools/bench/bench_jobs.py --jobs 50 --repeat 5 --lib flowengine
    python tools/bench/bench_jobs.py --scaling --jobs 100   # conductors x boards x libs
    python tools/bench/bench_jobs.py --baseline /tmp/main   # also another flowengine tree

``--baseline DIR`` adds a "flowengine before" row: the flowengine of another
source tree (e.g. ``git archive main | tar -x -C DIR``), measured in the same
run, interleaved with the others, by this script.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator

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
#: Conductor processes per measurement of --scaling (more than the cores:
#: on 2 cores, 4 and 8 measure how the board copes with contention).
SCALING_CONDUCTORS = (1, 2, 4, 8)
#: (library, board) pairs of --scaling; TaskFlow has no SQL board.
SCALING_BOARDS = (
    ("flowengine", "redis"),
    ("flowengine", "zookeeper"),
    ("flowengine", "postgresql"),
    ("taskflow", "redis"),
    ("taskflow", "zookeeper"),
)
#: The library label of the --baseline tree's flowengine, and how tables name each label.
BASE = "flowengine-base"
LABELS = {"flowengine": "flowengine", BASE: "flowengine before", "taskflow": "TaskFlow 6.5"}
#: Where --baseline's flowengine is imported from (set by main()).
BASELINE_DIR: str | None = None
#: How long the conductor processes of one measurement may take to start
#: (imports, connection, the first one's posting) on a loaded machine.
SCALING_START_TIMEOUT_S = 120.0


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
    sep = "&" if "?" in where else "?"
    return {"board": where + f"{sep}namespace=bench{tag}"}


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


def _shared_books(lib: str, persistence, tag: str, jobs: int) -> list:
    """``jobs`` (logbook, flow detail) pairs whose uuids derive from ``tag``.

    Every conductor process of one scaling run saves the same ones in its own
    memory persistence, so whichever claims a job finds its logbook.
    """
    models = __import__(f"{lib}.persistence.models", fromlist=["models"])
    engines = __import__(f"{lib}.engines", fromlist=["engines"])
    conn = persistence.get_connection()
    made = []
    for i in range(jobs):
        book = models.LogBook(f"bench-{i}", uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}/b{i}")))
        fd = models.FlowDetail("bench", uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}/f{i}")))
        book.add(fd)
        conn.save_logbook(book)
        engines.save_factory_details(fd, trivial_flow, [], {}, backend=persistence)
        made.append((book, fd))
    return made


def scale_child(lib: str, kind: str, where: str, tag: str, jobs: int, index: int) -> None:
    """One conductor process of a scaling run (protocol on stdin/stdout, see _scale_measure)."""
    os.environ["BENCH_JOBS_LIB"] = lib
    conductors = __import__(f"{lib}.conductors.backends", fromlist=["backends"])
    boards = __import__(f"{lib}.jobs.backends", fromlist=["backends"])
    memory = __import__(f"{lib}.persistence.backends.impl_memory", fromlist=["impl_memory"])
    persistence = memory.MemoryBackend({})
    books = _shared_books(lib, persistence, tag, jobs)
    board = boards.fetch(
        f"bench-{index}", _board_conf(lib, kind, where, tag), persistence=persistence
    )
    board.connect()
    if index == 0:
        for i, (book, fd) in enumerate(books):
            board.post(f"job-{i}", book, details={"flow_uuid": fd.uuid})
    conductor = conductors.fetch(
        "blocking", f"bench-conductor-{index}", board, persistence=persistence, engine="serial"
    )
    consumed = 0

    def on_consumed(_event, details):  # (the notifier passes details by name)
        nonlocal consumed
        consumed += 1
        print(f"consumed {time.monotonic()!r}", flush=True)  # one clock for every process

    conductor.notifier.register("job_consumed", on_consumed)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    runner = threading.Thread(target=conductor.run, daemon=True)
    runner.start()
    sys.stdin.readline()  # "stop", or EOF when the parent died
    conductor.stop()
    runner.join(30)
    board.close()
    print(json.dumps({"index": index, "consumed": consumed}), flush=True)


def _child_env(lib: str) -> dict:
    env = dict(os.environ)
    if lib in ("flowengine", BASE):
        root = BASELINE_DIR if lib == BASE else REPO_ROOT
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _byte_compile(roots: list[str]) -> None:
    """Write the bytecode of each flowengine tree, as pip did for TaskFlow's install.

    Without it a tree checked out with PYTHONDONTWRITEBYTECODE set (or a
    fresh ``git archive``) compiles every module it imports in every child,
    and the modules a conductor imports at its first job (the engine's)
    land inside the measured time: 40-50 ms per process here, TaskFlow's
    side paying nothing of the kind.
    """
    for root in roots:
        if not compileall.compile_dir(os.path.join(root, "flowengine"), quiet=1):
            raise SystemExit(f"could not byte-compile {root}/flowengine")


def _module(lib: str) -> str:
    """The package a library label imports (the baseline is a flowengine too)."""
    return "flowengine" if lib == BASE else lib


def _scale_measure(python: str, lib: str, kind: str, where: str, jobs: int, n: int) -> dict:
    """jobs/s of ``n`` conductor processes sharing one fresh board of ``kind``."""
    tag = uuid.uuid4().hex[:10]
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[subprocess.Popen] = []
    fail = {"lib": lib, "board": kind, "conductors": n, "ok": False}
    with tempfile.TemporaryFile("w+") as errors:
        try:
            for i in range(n):
                cmd = [
                    python,
                    os.path.abspath(__file__),
                    "--scale-child",
                    _module(lib),
                    kind,
                    where,
                ]
                proc = subprocess.Popen(
                    [*cmd, tag, str(jobs), str(i)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    text=True,
                    env=_child_env(lib),
                )
                procs.append(proc)
                threading.Thread(target=_pump, args=(i, proc, lines), daemon=True).start()
            ready = _collect(lines, n, "ready", SCALING_START_TIMEOUT_S)
            if ready is None:
                return {**fail, "error": "conductors did not start: " + _tail(errors)}
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            went = time.monotonic()
            done = _collect(lines, jobs, "consumed", RUN_TIMEOUT_S)
            if done is None:
                return {**fail, "error": "jobs were not all consumed: " + _tail(errors)}
        finally:
            for proc in procs:
                with contextlib.suppress(OSError):
                    proc.stdin.write("stop\n")
                    proc.stdin.close()
            for proc in procs:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    per = [0] * n
    for i, _t in done:
        per[i] += 1
    elapsed = max(t for _i, t in done) - went
    return {
        "lib": lib,
        "board": kind,
        "conductors": n,
        "jobs": jobs,
        "consumed": len(done),
        "ok": True,
        "elapsed_s": elapsed,
        "jobs_per_s": jobs / elapsed if elapsed > 0 else 0.0,
        "per_conductor": per,
    }


def _pump(index: int, proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put((index, line))
    lines.put((index, None))


def _collect(lines: queue.Queue, count: int, word: str, timeout_s: float) -> list | None:
    """``count`` lines starting with ``word`` as (child, float value); None on timeout/exit."""
    got: list[tuple[int, float]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        try:
            index, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if line is None:
            return None  # a child exited early
        if line.startswith(word):
            value = line.split()[1:2]
            got.append((index, float(value[0]) if value else 0.0))
    return got


def _tail(errors) -> str:
    errors.seek(0)
    return errors.read()[-2000:]


def _measure(python: str, lib: str, kind: str, where: str, jobs: int) -> dict:
    env = _child_env(lib)
    proc = subprocess.run(
        [python, os.path.abspath(__file__), "--child", _module(lib), kind, where, str(jobs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_TIMEOUT_S + 60,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"lib": lib, "board": kind, "ok": False, "error": proc.stderr[-2000:]}
    return {**json.loads(lines[-1]), "lib": lib}


def _show_run(label: str, run: dict) -> None:
    """One line on stderr per measurement as it ends (and its error if it failed)."""
    shown = f"{run['jobs_per_s']:.1f} jobs/s" if run.get("ok") else "FAILED"
    print(f"# run {label} {shown}", file=sys.stderr, flush=True)
    if not run.get("ok"):
        print(run.get("error", ""), file=sys.stderr)


def _spread(runs: list[dict]) -> tuple[float, str] | None:
    """(median jobs/s, "median (min-max)") of runs that all succeeded; None otherwise."""
    if not runs or not all(r.get("ok") for r in runs):
        return None
    rates = [r["jobs_per_s"] for r in runs]
    med = statistics.median(rates)
    return med, f"{med:.1f} ({min(rates):.0f}-{max(rates):.0f})"


def _ratio(cells: dict, a: tuple, b: tuple) -> str:
    x, y = cells.get(a), cells.get(b)
    return f"{x[0] / y[0]:.2f}x" if x and y else "-"


def _table(results: dict[tuple[str, str], list[dict]]) -> str:
    cells = {key: _spread(runs) for key, runs in results.items()}
    libs = [lib for lib in LABELS if any(k[0] == lib for k in cells)]
    pairs = [
        (a, b) for a, b in (("flowengine", "taskflow"), (BASE, "taskflow"), ("flowengine", BASE))
    ]
    pairs = [(a, b) for a, b in pairs if a in libs and b in libs]
    head = [f"{LABELS[lib]} jobs/s" for lib in libs] + [
        f"{LABELS[a]} / {LABELS[b]}" for a, b in pairs
    ]
    out = ["| board | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for kind in ("redis", "zookeeper", "sqlite"):
        if not any(k[1] == kind for k in cells):
            continue
        row = []
        for lib in libs:
            cell = cells.get((lib, kind))
            none = "- (no SQL board)" if lib == "taskflow" and kind == "sqlite" else "-"
            row.append(cell[1] if cell else none)
        row += [_ratio(cells, (a, kind), (b, kind)) for a, b in pairs]
        out.append(f"| {kind} | " + " | ".join(row) + " |")
    return "\n".join(out)


def _lag_table(results: dict[tuple[str, str], list[dict]]) -> str:
    """How long each conductor took after the last post: its own speed, not the poster's."""
    out = ["| board | library | last post -> all consumed, s (median, min-max) |", "|---|---|---:|"]
    for (lib, kind), runs in results.items():
        lags = [r["elapsed_s"] - r["post_s"] for r in runs if r.get("ok")]
        if lags and len(lags) == len(runs):
            med = statistics.median(lags)
            out.append(f"| {kind} | {LABELS[lib]} | {med:.2f} ({min(lags):.2f}-{max(lags):.2f}) |")
    return "\n".join(out)


def _scaling_table(results: dict[tuple[str, str, int], list[dict]], counts: list[int]) -> str:
    cells = {key: _spread(runs) for key, runs in results.items()}
    head = " | ".join(f"{n} conductor{'s' if n > 1 else ''}" for n in counts)
    out = [f"| board | library | {head} |", "|---|---|" + "---:|" * len(counts)]
    for kind in ("redis", "zookeeper", "postgresql"):
        libs = [lib for lib in LABELS if any(k[:2] == (lib, kind) for k in cells)]
        for lib in libs:
            row = [cells.get((lib, kind, n)) for n in counts]
            out.append(
                f"| {kind} | {LABELS[lib]} | " + " | ".join(c[1] if c else "-" for c in row) + " |"
            )
        for a, b in (("flowengine", "taskflow"), (BASE, "taskflow"), ("flowengine", BASE)):
            if a in libs and b in libs:
                ratios = [_ratio(cells, (a, kind, n), (b, kind, n)) for n in counts]
                name = f"{LABELS[a]} / {LABELS[b]}"
                out.append(f"| {kind} | {name} | " + " | ".join(ratios) + " |")
    return "\n".join(out)


@contextlib.contextmanager
def _servers(kinds: set[str], tmp: str) -> Iterator[dict[str, str]]:
    """Start the servers the boards of ``kinds`` need; their URLs by board kind."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    sys.path.insert(0, REPO_ROOT)
    import brokers

    with contextlib.ExitStack() as stack:
        where = {"sqlite": f"sqlite:///{tmp}/jobs.db"}
        if "redis" in kinds:
            where["redis"] = stack.enter_context(brokers.running_redis()).url
        if "zookeeper" in kinds:
            where["zookeeper"] = stack.enter_context(brokers.running_zookeeper()).url
        if "postgresql" in kinds:
            from tests.persistence import pg_server

            server = pg_server.start()  # as the tests' pg_url fixture: fsync off
            stack.callback(server.stop)
            where["postgresql"] = server.url
        yield where


def _pythons(libs: set[str]) -> dict[str, str]:
    pythons = {"flowengine": sys.executable, BASE: sys.executable}
    if "taskflow" in libs:
        pythons["taskflow"] = bench_core.ensure_taskflow_python(
            bench_core.TASKFLOW_VENV, "taskflow==6.5.0"
        )
        for module in ("kazoo", "redis"):  # TaskFlow's boards' optional clients
            if not bench_core._can_import(pythons["taskflow"], module):
                subprocess.run(
                    [pythons["taskflow"], "-m", "pip", "install", "-q", module], check=True
                )
    return pythons


def _run_scaling(args, wanted: list[tuple[str, str]]) -> int:
    counts = sorted(set(args.conductors))
    pythons = _pythons({lib for lib, _ in wanted})
    results: dict[tuple[str, str, int], list[dict]] = {
        (lib, kind, n): [] for lib, kind in wanted for n in counts
    }
    with tempfile.TemporaryDirectory() as tmp, _servers({k for _, k in wanted}, tmp) as where:
        for rep in range(args.repeat):  # interleaved: drift hits every cell alike
            for lib, kind in wanted:
                for n in counts:
                    run = _scale_measure(pythons[lib], lib, kind, where[kind], args.jobs, n)
                    results[(lib, kind, n)].append(run)
                    _show_run(f"{rep + 1}/{args.repeat} {lib:10} {kind:10} x{n}", run)
    print(
        f"\njobs/s against conductor processes, {args.jobs} one-task jobs posted"
        f" beforehand, blocking conductors, median (min-max) of {args.repeat} runs,"
        f" {os.cpu_count()} cores\n"
    )
    print(_scaling_table(results, counts))
    if args.json:
        print(json.dumps({f"{k[0]}/{k[1]}/{k[2]}": v for k, v in results.items()}, indent=1))
    return 0 if all(r.get("ok") for runs in results.values() for r in runs) else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=JOBS, help="jobs per run (%(default)s)")
    p.add_argument("--repeat", type=int, default=REPEAT, help="runs per board (%(default)s)")
    p.add_argument("--lib", action="append", choices=("flowengine", "taskflow"))
    p.add_argument(
        "--board", action="append", choices=("redis", "zookeeper", "sqlite", "postgresql")
    )
    p.add_argument("--scaling", action="store_true", help="jobs/s against conductor processes")
    p.add_argument(
        "--conductors",
        type=int,
        nargs="+",
        default=list(SCALING_CONDUCTORS),
        help="conductor processes per --scaling measurement (%(default)s)",
    )
    p.add_argument(
        "--baseline",
        metavar="DIR",
        help="also measure the flowengine of this source tree ('flowengine before')",
    )
    p.add_argument("--json", action="store_true", help="also print every run as JSON")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--scale-child", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        lib, kind, where, jobs = args.child
        print(json.dumps(child(lib, kind, where, int(jobs))), flush=True)
        return 0
    if args.scale_child:
        lib, kind, where, tag, jobs, index = args.scale_child
        scale_child(lib, kind, where, tag, int(jobs), int(index))
        return 0
    if args.repeat < 5:
        p.error("--repeat must be at least 5 (medians of fewer runs are noise)")
    pairs = list(SCALING_BOARDS if args.scaling else BOARDS)
    if args.baseline:
        global BASELINE_DIR
        BASELINE_DIR = os.path.abspath(args.baseline)
        if not os.path.isdir(os.path.join(BASELINE_DIR, "flowengine")):
            p.error(f"--baseline {args.baseline}: no flowengine package in that directory")
        pairs += [(BASE, kind) for lib, kind in pairs if lib == "flowengine"]
    wanted = [
        (lib, kind)
        for lib, kind in pairs
        if (not args.lib or _module(lib) in args.lib) and (not args.board or kind in args.board)
    ]
    if not wanted:
        p.error("no board of that library in this mode (TaskFlow has no SQL board)")
    _byte_compile([REPO_ROOT] + ([BASELINE_DIR] if BASELINE_DIR else []))
    if args.scaling:
        return _run_scaling(args, wanted)
    pythons = _pythons({lib for lib, _ in wanted})
    results: dict[tuple[str, str], list[dict]] = {key: [] for key in wanted}
    with tempfile.TemporaryDirectory() as tmp, _servers({k for _, k in wanted}, tmp) as where:
        for rep in range(args.repeat):  # interleaved: drift hits every board alike
            for lib, kind in wanted:
                run = _measure(pythons[lib], lib, kind, where[kind], args.jobs)
                results[(lib, kind)].append(run)
                _show_run(f"{rep + 1}/{args.repeat} {lib:10} {kind:9}", run)
    print(
        f"\njobs/s, post -> consumed, {args.jobs} one-task jobs, one blocking conductor,"
        f" median (min-max) of {args.repeat} runs (same Redis / ZooKeeper servers for both)\n"
    )
    print(_table(results))
    print(
        "\nA conductor that keeps up with the poster ends soon after the last post;"
        " jobs/s is then the poster's rate.\n"
    )
    print(_lag_table(results))
    if args.json:
        print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}, indent=1))
    return 0 if all(r.get("ok") for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
