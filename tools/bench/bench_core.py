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

on the ``serial`` and ``parallel`` engines.  Reported per case: build (flow
construction), compile (``engine.compile()``), prepare (``prepare()`` +
``validate()``), run (``engine.run()``), per-task cost of the run (the tasks do
nothing, so that is engine overhead), and peak RSS of the subprocess; then the
flowengine/TaskFlow ratios.

TaskFlow is installed from PyPI into its own virtualenv, cached under
``~/.cache/flowengine-bench/`` (never a flowengine dependency).

Usage::

    python tools/bench/bench_core.py                 # everything, table on stdout
    python tools/bench/bench_core.py --json          # plus one JSON document at the end
    python tools/bench/bench_core.py --lib flowengine --case linear-1000 --engine serial
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "flowengine-bench")
TASKFLOW_VENV = os.path.join(CACHE_DIR, "taskflow-venv")
# What `pip install` gets for the TaskFlow side; override with --taskflow-spec.
TASKFLOW_SPEC = "taskflow"

CASES = {
    # name: (pattern, number of tasks)
    "linear-50": ("linear", 50),
    "linear-1000": ("linear", 1000),
    "graph-2000": ("graph", 2000),
}
ENGINES = ("serial", "parallel")
LIBS = ("flowengine", "taskflow")
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


def _graph_deps(n: int) -> list[list[int]]:
    rng = random.Random(GRAPH_SEED)
    deps = []
    for i in range(n):
        k = min(i, rng.randint(0, GRAPH_MAX_DEPS))
        deps.append(sorted(rng.sample(range(i), k)) if k else [])
    return deps


def run_child(lib: str, case: str, engine_name: str) -> dict:
    """Run one case in this process and return its measurements."""
    if lib == "flowengine" and REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)  # works without `pip install -e .` too
    t0 = time.perf_counter()
    engines = __import__(f"{lib}.engines", fromlist=["load"])
    task_mod = __import__(f"{lib}.task", fromlist=["Task"])
    linear_flow = __import__(f"{lib}.patterns.linear_flow", fromlist=["Flow"])
    graph_flow = __import__(f"{lib}.patterns.graph_flow", fromlist=["Flow"])
    import_s = time.perf_counter() - t0
    rss_base = _peak_rss_mb()

    class Noop(task_mod.Task):
        def execute(self):
            return None

    class Node(task_mod.Task):
        def execute(self, *args, **kwargs):
            return 1

    pattern, n = CASES[case]
    t0 = time.perf_counter()
    if pattern == "linear":
        flow = linear_flow.Flow(case)
        flow.add(*[Noop(name=f"t{i}") for i in range(n)])
    else:
        flow = graph_flow.Flow(case)
        flow.add(*[Node(name=f"t{i}", provides=f"s{i}",
                        requires=[f"s{j}" for j in deps])
                   for i, deps in enumerate(_graph_deps(n))])
    build_s = time.perf_counter() - t0

    engine = engines.load(flow, engine=engine_name)
    t0 = time.perf_counter()
    engine.compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.prepare()
    engine.validate()
    prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.run()
    run_s = time.perf_counter() - t0

    version = getattr(sys.modules[lib], "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(lib)
        except metadata.PackageNotFoundError:
            version = "?"
    return {
        "lib": lib, "version": version, "case": case, "engine": engine_name, "tasks": n,
        "import_s": import_s, "build_s": build_s, "compile_s": compile_s,
        "prepare_s": prepare_s, "run_s": run_s, "per_task_ms": run_s / n * 1000.0,
        "peak_rss_mb": _peak_rss_mb(), "base_rss_mb": rss_base,
        "engine_class": type(engine).__name__,
    }


# --------------------------------------------------------------------------
# parent side: venv, subprocesses, table
# --------------------------------------------------------------------------

def ensure_taskflow_python(venv: str, spec: str) -> str:
    """Path of a python that can import taskflow, creating the cached venv if needed."""
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python) and _can_import(python, "taskflow"):
        return python
    print(f"# creating {venv} with `pip install {spec}` (cached for later runs)",
          file=sys.stderr)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
                   check=True)
    if not _can_import(python, "taskflow"):
        raise SystemExit(f"taskflow still not importable with {python}")
    return python


def _can_import(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def run_case(python: str, lib: str, case: str, engine_name: str, timeout_s: float) -> dict:
    """Run one case in a fresh subprocess of ``python``."""
    cmd = [python, os.path.abspath(__file__), "--child", "--lib", lib,
           "--case", case, "--engine", engine_name]
    base = {"lib": lib, "case": case, "engine": engine_name}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              cwd=CACHE_DIR if lib == "taskflow" else REPO_ROOT)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timeout after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {**base, "error": f"exit {proc.returncode}: {last}", "stderr": proc.stderr[-4000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best_of(runs: list[dict]) -> dict:
    """Merge repeated runs of one case: the lowest time of each phase, the highest RSS."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    best = dict(ok[0])
    for key in ("import_s", "build_s", "compile_s", "prepare_s", "run_s", "per_task_ms"):
        best[key] = min(r[key] for r in ok)
    best["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
    best["repeats"] = len(ok)
    return best


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f}ms" if v < 1 else f"{v:.2f}s"


def _ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.3f}x" if a / b < 0.1 else f"{a / b:.2f}x"


def print_table(results: list[dict], out=sys.stdout) -> None:
    """Print per-library rows, then the flowengine/TaskFlow ratios."""
    head = (f"{'case':<12} {'engine':<9} {'lib':<11} {'build':>9} {'compile':>9} "
            f"{'prepare':>9} {'run':>9} {'per task':>11} {'peak RSS':>9}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in results:
        if "error" in r:
            print(f"{r['case']:<12} {r['engine']:<9} {r['lib']:<11} ERROR {r['error']}",
                  file=out)
            continue
        print(f"{r['case']:<12} {r['engine']:<9} {r['lib']:<11} {_fmt_s(r['build_s']):>9} "
              f"{_fmt_s(r['compile_s']):>9} {_fmt_s(r['prepare_s']):>9} {_fmt_s(r['run_s']):>9} "
              f"{r['per_task_ms']:>8.3f}ms {r['peak_rss_mb']:>7.0f}MB", file=out)
    by_key = {(r["lib"], r["case"], r["engine"]): r for r in results if "error" not in r}
    pairs = [(c, e) for c in CASES for e in ENGINES
             if ("flowengine", c, e) in by_key and ("taskflow", c, e) in by_key]
    if not pairs:
        return
    print("\nflowengine / TaskFlow (lower is better for flowengine)", file=out)
    head = (f"{'case':<12} {'engine':<9} {'compile':>9} {'run':>9} {'total':>9} "
            f"{'peak RSS':>9}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for case, eng in pairs:
        fe, tf = by_key[("flowengine", case, eng)], by_key[("taskflow", case, eng)]
        total = [r["build_s"] + r["compile_s"] + r["prepare_s"] + r["run_s"] for r in (fe, tf)]
        print(f"{case:<12} {eng:<9} {_ratio(fe['compile_s'], tf['compile_s']):>9} "
              f"{_ratio(fe['run_s'], tf['run_s']):>9} {_ratio(*total):>9} "
              f"{_ratio(fe['peak_rss_mb'], tf['peak_rss_mb']):>9}", file=out)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", choices=LIBS, action="append",
                   help="library to run (repeatable; default: both)")
    p.add_argument("--case", choices=list(CASES), action="append",
                   help="case to run (repeatable; default: all)")
    p.add_argument("--engine", choices=ENGINES, action="append",
                   help="engine to run (repeatable; default: both)")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each case N times (fresh subprocesses), keep the best times")
    p.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S,
                   help="seconds allowed per case (default %(default)s)")
    p.add_argument("--taskflow-venv", default=TASKFLOW_VENV,
                   help="virtualenv for TaskFlow (created and cached if missing)")
    p.add_argument("--taskflow-spec", default=TASKFLOW_SPEC,
                   help="pip requirement for TaskFlow (default %(default)s)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        print(json.dumps(run_child(args.lib[0], args.case[0], args.engine[0])))
        return 0

    libs = args.lib or list(LIBS)
    cases = args.case or list(CASES)
    engine_names = args.engine or list(ENGINES)
    os.makedirs(CACHE_DIR, exist_ok=True)
    pythons = {"flowengine": sys.executable}
    if "flowengine" in libs:
        # TaskFlow's files were byte-compiled by pip; give flowengine the same
        # footing (PYTHONDONTWRITEBYTECODE would otherwise make every child
        # compile the sources it imports lazily, inside the timed phases).
        subprocess.run([sys.executable, "-m", "compileall", "-q",
                        os.path.join(REPO_ROOT, "flowengine")], check=False,
                       stdout=subprocess.DEVNULL)
    if "taskflow" in libs:
        pythons["taskflow"] = ensure_taskflow_python(args.taskflow_venv, args.taskflow_spec)

    print(f"# python {platform.python_version()} on {platform.machine()}, "
          f"{os.cpu_count()} CPUs; each case in a fresh subprocess", file=sys.stderr)
    results = []
    for case in cases:
        for eng in engine_names:
            for lib in libs:
                runs = [run_case(pythons[lib], lib, case, eng, args.timeout)
                        for _ in range(max(1, args.repeat))]
                r = best_of(runs)
                results.append(r)
                status = r.get("error") or (f"compile {_fmt_s(r['compile_s'])}, "
                                            f"run {_fmt_s(r['run_s'])}")
                print(f"# {case} {eng} {lib}: {status}", file=sys.stderr, flush=True)
    print_table(results)
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
