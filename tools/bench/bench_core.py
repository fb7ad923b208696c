#!/usr/bin/env python3
"""Core benchmark: flowengine vs TaskFlow (PyPI) on large local flows.

Runs the same cases on both libraries — the API is the same, only the import
differs — each case in a fresh subprocess so nothing (imports, caches, memory)
carries over:

- ``linear-50``     linear flow of 50 trivial tasks
- ``linear-1000``   linear flow of 1,000 trivial tasks
- ``graph-2000``    graph flow of 2,000 tasks, each requiring up to
                    ``GRAPH_MAX_DEPS`` symbols provided by random earlier tasks
                    (fixed seed, so both libraries get the same graph)

on the ``serial`` and ``parallel`` engines; and the scale cases
``graph-1000``, ``graph-10000`` and ``graph-100000`` (the same kind of graph)
on the ``serial`` engine, to show the cost grows linearly in the number of
tasks (TaskFlow is left out of the two largest: it grows about
quadratically and would take hours; the output says so).  Reported per case:
build (flow construction), compile (``engine.compile()``), prepare
(``prepare()`` + ``validate()``), run (``engine.run()``), their total, the
run's cost per task (the tasks do nothing, so that is engine overhead), the
CPU time of all four phases (also per task), how much of it the cyclic
garbage collector took and in how many full collections, and the peak RSS
of the subprocess; then the flowengine/TaskFlow ratios.  With ``--repeat N``
each figure is the median of N fresh subprocesses, with the minimum and
maximum beside it; the repetitions alternate between the libraries.

``--baseline-root DIR`` adds another flowengine source tree (say an export
of ``main``) as library ``baseline``, so a change is measured before and
after in the same run.  ``--instructions`` also counts the instructions of
each phase with valgrind's callgrind (CPU-time figures move with the load of
a shared machine, instruction counts do not), for flowengine's cases of at
most ``INSTRUCTIONS_MAX_TASKS`` tasks.

TaskFlow is installed from PyPI into its own virtualenv, cached under
``~/.cache/flowengine-bench/`` (never a flowengine dependency).

Usage::

    python tools/bench/bench_core.py                 # everything, table on stdout
    python tools/bench/bench_core.py --json          # plus one JSON document at the end
    python tools/bench/bench_core.py --lib flowengine --case linear-1000 --engine serial
    python tools/bench/bench_core.py --scale --repeat 5      # n = 1k, 10k, 100k; serial
    python tools/bench/bench_core.py --scale --lib flowengine --baseline-root /tmp/main
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import callgrind  # noqa: E402  (instruction counts, next to this file)

CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "flowengine-bench")
TASKFLOW_VENV = os.path.join(CACHE_DIR, "taskflow-venv")
# What `pip install` gets for the TaskFlow side; override with --taskflow-spec.
TASKFLOW_SPEC = "taskflow"

CASES = {
    # name: (pattern, number of tasks)
    "linear-50": ("linear", 50),
    "linear-1000": ("linear", 1000),
    "graph-2000": ("graph", 2000),
    "graph-1000": ("graph", 1000),
    "graph-10000": ("graph", 10_000),
    "graph-100000": ("graph", 100_000),
}
ENGINES = ("serial", "parallel")
LIBS = ("flowengine", "taskflow", "baseline")
#: The scale cases (issue 16): cost per task must stay flat as n grows.
SCALE_CASES = ("graph-1000", "graph-10000", "graph-100000")
#: Engines a case runs on when none is asked for: the scale cases only on
#: the serial engine (the issue's figures are the serial engine's).
CASE_ENGINES = {name: ("serial",) for name in SCALE_CASES}
#: Cases TaskFlow is not run on, and why (printed with the results).
TASKFLOW_SKIPPED = {
    "graph-10000": "TaskFlow skipped: its cost grows ~n^2 (about 80 s at n=2,000),"
    " n=10,000 would take about half an hour",
    "graph-100000": "TaskFlow skipped: its cost grows ~n^2 (about 80 s at n=2,000),"
    " n=100,000 would take days",
}
#: Phases of a case, in order (the child can stop after any of them).
#: "load" is ``engines.load()``: untimed, but a phase of its own for the
#: instruction counts, since the first load in a process costs a fixed
#: ~300 million instructions (the engine's entry points are looked up), which
#: counted as compile's made compile look 3.5x dearer per task at 1,000 tasks
#: than at 10,000.
PHASES = ("import", "build", "load", "compile", "prepare", "run")
#: --instructions counts only cases up to this size: callgrind runs Python
#: about 30 times slower, and one run per phase is needed per case.
INSTRUCTIONS_MAX_TASKS = 10_000
# Fixed so that both libraries (and every run) build the identical graph.
GRAPH_SEED = 20240101
# Each graph task requires 0..GRAPH_MAX_DEPS symbols of random earlier tasks:
# enough edges to make scoping work, few enough to stay a wide DAG.
GRAPH_MAX_DEPS = 3
# TaskFlow needs ~80 s for the 2,000-task graph on one engine here; a case
# past this is reported as a timeout instead of stalling the whole run.
CASE_TIMEOUT_S = 600.0


# --------------------------------------------------------------------------
# child side: one case, one library, one engine; prints one JSON line
# --------------------------------------------------------------------------


def _peak_rss_mb() -> float:
    import resource

    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _graph_deps(n: int) -> list[tuple[int, ...]]:
    rng = random.Random(GRAPH_SEED)
    deps: list[tuple[int, ...]] = []
    for i in range(n):
        k = min(i, rng.randint(0, GRAPH_MAX_DEPS))
        # Tuples of ints: the collector stops tracking them, so the bench's
        # own 100,000 entries are not walked by every collection it measures.
        deps.append(tuple(sorted(rng.sample(range(i), k))) if k else ())
    return deps


class _CollectorClock:
    """CPU time the cyclic garbage collector spends, and its full collections.

    Registered in ``gc.callbacks`` for the child's lifetime: at 100,000 tasks
    the collector's full passes over millions of live objects are a large
    part of the growth in cost per task, invisible in a profile (they are
    charged to whatever function allocated at that moment).
    """

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.process_time()
            return
        self.cpu_s += time.process_time() - self._started
        if info.get("generation") == 2:
            self.full += 1


def run_child(
    lib: str, case: str, engine_name: str, root: str | None = None, stop_after: str = "run"
) -> dict:
    """Run one case in this process and return its measurements.

    ``lib`` 'flowengine' imports flowengine from ``root`` (default: this
    repository); ``stop_after`` ends the case after that phase (see PHASES).
    """
    if lib != "taskflow":
        root = root or REPO_ROOT
        if sys.path[:1] != [root]:
            sys.path.insert(0, root)  # works without `pip install -e .` too
        lib = "flowengine"
    cpu: dict[str, float] = {}
    import gc

    collector = _CollectorClock()
    gc.callbacks.append(collector)
    t0, c0 = time.perf_counter(), time.process_time()
    engines = __import__(f"{lib}.engines", fromlist=["load"])
    task_mod = __import__(f"{lib}.task", fromlist=["Task"])
    linear_flow = __import__(f"{lib}.patterns.linear_flow", fromlist=["Flow"])
    graph_flow = __import__(f"{lib}.patterns.graph_flow", fromlist=["Flow"])
    import_s = time.perf_counter() - t0
    cpu["import"] = time.process_time() - c0
    rss_base = _peak_rss_mb()
    if stop_after == "import":
        return {"stopped_after": stop_after}

    class Noop(task_mod.Task):
        def execute(self):
            return None

    class Node(task_mod.Task):
        def execute(self, *args, **kwargs):
            return 1

    pattern, n = CASES[case]
    deps = _graph_deps(n) if pattern == "graph" else []
    gc_before_s, full_before = collector.cpu_s, collector.full
    t0, c0 = time.perf_counter(), time.process_time()
    if pattern == "linear":
        flow = linear_flow.Flow(case)
        flow.add(*[Noop(name=f"t{i}") for i in range(n)])
    else:
        flow = graph_flow.Flow(case)
        flow.add(
            *[
                Node(name=f"t{i}", provides=f"s{i}", requires=[f"s{j}" for j in deps])
                for i, deps in enumerate(deps)
            ]
        )
    build_s = time.perf_counter() - t0
    cpu["build"] = time.process_time() - c0
    if stop_after == "build":
        return {"stopped_after": stop_after}

    engine = engines.load(flow, engine=engine_name)
    if stop_after == "load":
        return {"stopped_after": stop_after}
    t0, c0 = time.perf_counter(), time.process_time()
    engine.compile()
    compile_s = time.perf_counter() - t0
    cpu["compile"] = time.process_time() - c0
    if stop_after == "compile":
        return {"stopped_after": stop_after}
    t0, c0 = time.perf_counter(), time.process_time()
    engine.prepare()
    engine.validate()
    prepare_s = time.perf_counter() - t0
    cpu["prepare"] = time.process_time() - c0
    if stop_after == "prepare":
        return {"stopped_after": stop_after}
    t0, c0 = time.perf_counter(), time.process_time()
    engine.run()
    run_s = time.perf_counter() - t0
    cpu["run"] = time.process_time() - c0

    version = getattr(sys.modules[lib], "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(lib)
        except metadata.PackageNotFoundError:
            version = "?"
    return {
        "lib": lib,
        "version": version,
        "case": case,
        "engine": engine_name,
        "tasks": n,
        "import_s": import_s,
        "build_s": build_s,
        "compile_s": compile_s,
        "prepare_s": prepare_s,
        "run_s": run_s,
        "per_task_ms": run_s / n * 1000.0,
        "total_s": build_s + compile_s + prepare_s + run_s,
        "cpu_s": cpu["build"] + cpu["compile"] + cpu["prepare"] + cpu["run"],
        "cpu_run_per_task_ms": cpu["run"] / n * 1000.0,
        "cpu_per_task_ms": (cpu["build"] + cpu["compile"] + cpu["prepare"] + cpu["run"])
        / n
        * 1000.0,
        # Collector time and full collections in the four phases (not the imports).
        "gc_s": collector.cpu_s - gc_before_s,
        "gc_full": collector.full - full_before,
        "peak_rss_mb": _peak_rss_mb(),
        "base_rss_mb": rss_base,
        "engine_class": type(engine).__name__,
    }


# --------------------------------------------------------------------------
# parent side: venv, subprocesses, table
# --------------------------------------------------------------------------


def ensure_taskflow_python(venv: str, spec: str) -> str:
    """Path of a python that can import taskflow, creating the cached venv if needed."""
    return ensure_venv_python(venv, spec, "taskflow")


def ensure_venv_python(venv: str, spec: str, modules: str) -> str:
    """``venv``'s python once it imports ``modules`` ("a, b"); pip-installs ``spec`` first if not.

    The venv is cached for later runs; SystemExit if the install did not help.
    """
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python) and _can_import(python, modules):
        return python
    print(f"# creating {venv} with `pip install {spec}` (cached for later runs)", file=sys.stderr)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", spec], check=True
    )
    if not _can_import(python, modules):
        raise SystemExit(f"{modules} still not importable with {python}")
    return python


def _can_import(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def run_case(
    python: str, lib: str, case: str, engine_name: str, timeout_s: float, root: str | None = None
) -> dict:
    """Run one case in a fresh subprocess of ``python``."""
    cmd = [
        python,
        os.path.abspath(__file__),
        "--child",
        "--lib",
        lib,
        "--case",
        case,
        "--engine",
        engine_name,
    ]
    if root:
        cmd += ["--root", root]
    base = {"lib": lib, "case": case, "engine": engine_name}
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=CACHE_DIR if lib == "taskflow" else REPO_ROOT,
        )
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timeout after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {**base, "error": f"exit {proc.returncode}: {last}", "stderr": proc.stderr[-4000:]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "lib": lib}


#: Figures summarised over repetitions (median, min, max).
TIMED_KEYS = (
    "import_s",
    "build_s",
    "compile_s",
    "prepare_s",
    "run_s",
    "total_s",
    "per_task_ms",
    "cpu_s",
    "cpu_run_per_task_ms",
    "cpu_per_task_ms",
    "gc_s",
    "gc_full",
    "peak_rss_mb",
)


def summarise(runs: list[dict]) -> dict:
    """Merge repeated runs of one case: each figure's median, with ``<key>_min``/``_max``."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = dict(ok[0])
    for key in TIMED_KEYS:
        values = [r[key] for r in ok if key in r]
        if values:
            out[key] = statistics.median(values)
            out[key + "_min"], out[key + "_max"] = min(values), max(values)
    out["repeats"] = len(ok)
    return out


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f}ms" if v < 1 else f"{v:.2f}s"


def _spread(r: dict, key: str, fmt) -> str:
    """``median`` or, over several runs, ``median (min-max)``."""
    if r.get("repeats", 1) < 2 or key + "_min" not in r:
        return fmt(r[key])
    return f"{fmt(r[key])} ({fmt(r[key + '_min'])}-{fmt(r[key + '_max'])})"


def _ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.3f}x" if a / b < 0.1 else f"{a / b:.2f}x"


def print_table(results: list[dict], out=sys.stdout) -> None:
    """Print per-library rows (median (min-max) when repeated), then the ratios."""
    cols = [
        ("build", "build_s", _fmt_s),
        ("compile", "compile_s", _fmt_s),
        ("prepare", "prepare_s", _fmt_s),
        ("run", "run_s", _fmt_s),
        ("total", "total_s", _fmt_s),
        ("per task", "per_task_ms", lambda v: f"{v:.3f}ms"),
        ("CPU", "cpu_s", _fmt_s),
        ("CPU/task", "cpu_per_task_ms", lambda v: f"{v:.4f}ms"),
        ("of it GC", "gc_s", _fmt_s),
        ("full GCs", "gc_full", lambda v: f"{v:.0f}"),
        ("peak RSS", "peak_rss_mb", lambda v: f"{v:.0f}MB"),
    ]
    rows = []
    for r in results:
        if "error" in r:
            rows.append((r, None))
            continue
        rows.append((r, [_spread(r, key, fmt) if key in r else "-" for _n, key, fmt in cols]))
    widths = [
        max([len(name)] + [len(cells[i]) for _r, cells in rows if cells])
        for i, (name, _k, _f) in enumerate(cols)
    ]
    head = f"{'case':<12} {'engine':<9} {'lib':<11} " + " ".join(
        f"{name:>{w}}" for (name, _k, _f), w in zip(cols, widths)
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for r, cells in rows:
        lead = f"{r['case']:<12} {r['engine']:<9} {r['lib']:<11}"
        if cells is None:
            print(f"{lead} ERROR {r['error']}", file=out)
        else:
            print(lead + " " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths)), file=out)
    by_key = {(r["lib"], r["case"], r["engine"]): r for r in results if "error" not in r}
    for other, title in (
        ("taskflow", "flowengine / TaskFlow (lower is better for flowengine)"),
        ("baseline", "flowengine / baseline (lower: faster than the baseline)"),
    ):
        pairs = [
            (c, e)
            for c in CASES
            for e in ENGINES
            if ("flowengine", c, e) in by_key and (other, c, e) in by_key
        ]
        if not pairs:
            continue
        print(f"\n{title}", file=out)
        head = f"{'case':<12} {'engine':<9} {'compile':>9} {'run':>9} {'total':>9} {'peak RSS':>9}"
        print(head, file=out)
        print("-" * len(head), file=out)
        for case, eng in pairs:
            fe, ot = by_key[("flowengine", case, eng)], by_key[(other, case, eng)]
            total = [r["build_s"] + r["compile_s"] + r["prepare_s"] + r["run_s"] for r in (fe, ot)]
            print(
                f"{case:<12} {eng:<9} {_ratio(fe['compile_s'], ot['compile_s']):>9} "
                f"{_ratio(fe['run_s'], ot['run_s']):>9} {_ratio(*total):>9} "
                f"{_ratio(fe['peak_rss_mb'], ot['peak_rss_mb']):>9}",
                file=out,
            )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lib",
        choices=LIBS,
        action="append",
        help="library to run (repeatable; default: flowengine and taskflow,"
        " plus baseline with --baseline-root)",
    )
    p.add_argument(
        "--case",
        choices=list(CASES),
        action="append",
        help="case to run (repeatable; default: all)",
    )
    p.add_argument(
        "--scale", action="store_true", help="the scale cases only: " + ", ".join(SCALE_CASES)
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        action="append",
        help="engine to run (repeatable; default: both, serial for scale cases)",
    )
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each case N times (fresh subprocesses): medians, min and max",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=CASE_TIMEOUT_S,
        help="seconds allowed per case (default %(default)s)",
    )
    p.add_argument(
        "--baseline-root",
        metavar="DIR",
        help="another flowengine source tree, run as library 'baseline'",
    )
    p.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per phase with callgrind (flowengine and"
        f" baseline, cases of at most {INSTRUCTIONS_MAX_TASKS} tasks)",
    )
    p.add_argument(
        "--taskflow-venv",
        default=TASKFLOW_VENV,
        help="virtualenv for TaskFlow (created and cached if missing)",
    )
    p.add_argument(
        "--taskflow-spec",
        default=TASKFLOW_SPEC,
        help="pip requirement for TaskFlow (default %(default)s)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--stop-after", choices=PHASES, default="run", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        print(
            json.dumps(
                run_child(args.lib[0], args.case[0], args.engine[0], args.root, args.stop_after)
            )
        )
        return 0

    libs = args.lib or ["flowengine", "taskflow"] + (["baseline"] if args.baseline_root else [])
    if "baseline" in libs and not args.baseline_root:
        p.error("--lib baseline needs --baseline-root DIR")
    roots = {"flowengine": REPO_ROOT, "baseline": args.baseline_root, "taskflow": None}
    cases = args.case or (list(SCALE_CASES) if args.scale else list(CASES))
    os.makedirs(CACHE_DIR, exist_ok=True)
    pythons = {"flowengine": sys.executable, "baseline": sys.executable}
    for lib in ("flowengine", "baseline"):
        if lib in libs:
            # TaskFlow's files were byte-compiled by pip; give flowengine the same
            # footing (PYTHONDONTWRITEBYTECODE would otherwise make every child
            # compile the sources it imports lazily, inside the timed phases).
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", os.path.join(roots[lib], "flowengine")],
                check=False,
                stdout=subprocess.DEVNULL,
            )
    if "taskflow" in libs:
        pythons["taskflow"] = ensure_taskflow_python(args.taskflow_venv, args.taskflow_spec)

    print(
        f"# python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs; each case in a fresh subprocess",
        file=sys.stderr,
    )
    results, counted, notes = [], [], []
    for case in cases:
        for eng in args.engine or CASE_ENGINES.get(case, ENGINES):
            case_libs = []
            for lib in libs:
                if lib == "taskflow" and case in TASKFLOW_SKIPPED:
                    notes.append(f"{case}: {TASKFLOW_SKIPPED[case]}")
                else:
                    case_libs.append(lib)
            # Repetitions alternate between the libraries (a, b, a, b, ...),
            # so that a shared machine's load, which drifts over minutes,
            # weighs on each library alike.
            runs_of: dict[str, list[dict]] = {lib: [] for lib in case_libs}
            for _ in range(max(1, args.repeat)):
                for lib in case_libs:
                    runs_of[lib].append(
                        run_case(pythons[lib], lib, case, eng, args.timeout, roots[lib])
                    )
            for lib in case_libs:
                r = summarise(runs_of[lib])
                results.append(r)
                status = r.get("error") or (
                    f"total {_fmt_s(r['total_s'])}, "
                    f"run {_fmt_s(r['run_s'])}, "
                    f"{r['peak_rss_mb']:.0f} MB"
                )
                print(f"# {case} {eng} {lib}: {status}", file=sys.stderr, flush=True)
                if (
                    args.instructions
                    and lib != "taskflow"
                    and CASES[case][1] <= INSTRUCTIONS_MAX_TASKS
                ):
                    child = [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--child",
                        "--lib",
                        lib,
                        "--case",
                        case,
                        "--engine",
                        eng,
                    ]
                    if roots[lib]:
                        child += ["--root", roots[lib]]
                    counted.append(
                        {
                            "lib": lib,
                            "case": case,
                            "engine": eng,
                            **callgrind.count(
                                child, PHASES, CASES[case][1], args.timeout, REPO_ROOT
                            ),
                        }
                    )
    print_table(results)
    for note in notes:
        print(note)
    if counted:
        callgrind.print_table(counted)
    if args.json:
        print(json.dumps({"results": results, "instructions": counted}, indent=2))
    return 1 if any("error" in r for r in results + counted) else 0


if __name__ == "__main__":
    sys.exit(main())
