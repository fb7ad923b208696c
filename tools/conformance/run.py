#!/usr/bin/env python3
"""Run TaskFlow 6.5.0's own unit tests against flowengine (issue 12).

Downloads TaskFlow's wheel into a cache (never a dependency), rewrites
``taskflow`` imports to ``flowengine`` outside TaskFlow's test scaffolding,
runs the tests with pytest in a subprocess (which inherits PYTHONPATH, so
``PYTHONPATH=/some/worktree`` tests that tree's flowengine) and compares with
the committed baseline of tests that pass on TaskFlow itself.  Exit status is
non-zero iff a public-API test that passes on TaskFlow fails on flowengine.
See README.md next to this file.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import classification
import fetching
import probes
import results as results_mod
import rewriting

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
BASELINE = HERE / f"taskflow-{fetching.TASKFLOW_VERSION}-passing.txt"
# Per-test bound (pytest-timeout); TaskFlow's slowest unit tests take seconds.
TEST_TIMEOUT_S = 120
# Bound on the whole pytest subprocess, so a wedged run fails instead of hanging CI.
RUN_TIMEOUT_S = 1200
# What the baseline venv needs besides TaskFlow to run TaskFlow's tests:
# the conformance extra, and kombu for the worker-based engine (an optional
# TaskFlow dependency that flowengine's environment always has).
BASELINE_VENV_PACKAGES = (
    "pytest",
    "pytest-timeout",
    "testtools",
    "testscenarios",
    "fixtures",
    "oslotest",
    "oslo.utils",
    "oslo.serialization",
    "SQLAlchemy",
    "alembic",
    "redis",
    "kombu",
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--module",
        action="append",
        default=[],
        help="run only modules whose dotted name (e.g. persistence, "
        "test_engines) starts with or equals this; repeatable",
    )
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument(
        "--source", type=Path, help="flowengine source tree to test (prepended to PYTHONPATH)"
    )
    parser.add_argument(
        "--show-failures",
        action="store_true",
        help="print the traceback of every failed gated test (all with --all)",
    )
    parser.add_argument(
        "--causes",
        action="store_true",
        help="group failed gated tests (all with --all) by their error line",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="with --show-failures, also show internal/deferred failures",
    )
    parser.add_argument(
        "--refresh-baseline",
        action="store_true",
        help=f"run the tests on TaskFlow itself and rewrite {BASELINE.name}",
    )
    parser.add_argument(
        "--keep-work",
        action="store_true",
        help="keep the rewritten work tree (path printed) for debugging",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=TEST_TIMEOUT_S,
        help="per-test timeout in seconds (default %(default)s)",
    )
    return parser.parse_args(argv)


def _selected(module: str, filters: list[str]) -> bool:
    return not filters or any(module.startswith(f) for f in filters)


def _module_files(unit: Path, filters: list[str]) -> list[str]:
    files = []
    for path in sorted(unit.rglob("test_*.py")):
        module = results_mod.module_of(str(path.relative_to(unit)))
        if _selected(module, filters):
            files.append(str(path))
    return files


def _taskflow_python(cache: Path) -> str:
    """An interpreter with TaskFlow 6.5.0: this one if it has it, else a cache venv."""
    try:
        if importlib.metadata.version("taskflow") == fetching.TASKFLOW_VERSION:
            return sys.executable
    except importlib.metadata.PackageNotFoundError:
        pass
    venv = cache / f"venv-taskflow-{fetching.TASKFLOW_VERSION}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                f"taskflow=={fetching.TASKFLOW_VERSION}",
                *BASELINE_VENV_PACKAGES,
            ],
            check=True,
        )
    return str(python)


def _run_pytest(
    python: str, work: Path, files: list[str], args: argparse.Namespace, env: dict[str, str]
) -> results_mod.RunResults:
    results_file = work / "results.jsonl"
    env = dict(env, **{"FLOWENGINE_CONFORMANCE_RESULTS": str(results_file)})
    if not args.refresh_baseline:  # TaskFlow itself runs them all, for the baseline
        env["FLOWENGINE_CONFORMANCE_NOT_RUN"] = json.dumps(sorted(classification.NOT_RUN))
    cmd = [
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(work),
        f"--timeout={args.timeout}",
        "--continue-on-collection-errors",
        *files,
    ]
    if args.keyword:
        cmd += ["-k", args.keyword]
    log = work / "pytest.log"
    with open(log, "w") as out:
        proc = subprocess.run(
            cmd,
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    # 0 all passed, 1 some failed, 5 nothing selected (-k); anything else broke.
    if proc.returncode not in (0, 1, 5):
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"pytest exited {proc.returncode}; the end of its output:\n{tail}")
    return results_mod.load(results_file)


def _engine_origin(python: str, env: dict[str, str], target: str) -> str:
    probe = f"import {target}, os; print(os.path.dirname({target}.__file__))"
    proc = subprocess.run(
        [python, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    return proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]


def _environment() -> str:
    """What TaskFlow's probes will find here (the work tree asks the same module)."""
    answers = {
        "ZooKeeper": probes.zookeeper_available(None),
        "Redis": probes.redis_available("0"),
        "etcd": probes.etcd_available(),
        "eventlet": probes.EVENTLET_AVAILABLE,
    }
    return ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in answers.items())


@contextlib.contextmanager
def _servers(env: dict[str, str]) -> Iterator[set[str]]:
    """Start Redis and ZooKeeper for TaskFlow's tests unless ``env`` names some already.

    Sets their ``TASKFLOW_TEST_*_PORT`` in ``env`` (and here, for the probes);
    yields the kinds that could not be had: fatal under CI=true, otherwise
    the tests that need them leave the gate (with a line saying so).
    """
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import brokers  # tests/brokers.py: the servers the test suite starts
    finally:
        sys.path.pop(0)
    wanted = tuple(
        k
        for k, var in brokers.TASKFLOW_PORT_VARS.items()
        if var not in env and "TAKSFLOW_TEST_URL" not in env
    )
    with brokers.taskflow_test_servers(wanted) as (ports, unavailable):
        env.update(ports)
        os.environ.update(ports)
        for kind, why in unavailable.items():
            if IN_CI:
                raise SystemExit(f"CI=true and {kind} for TaskFlow's tests is unavailable: {why}")
            print(f"{kind} unavailable ({why}): the tests that need it are not gated here")
        yield set(unavailable)


def _read_baseline() -> set[str]:
    if not BASELINE.exists():
        return set()
    return {
        line.strip()
        for line in BASELINE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }


def _write_baseline(passing: set[str]) -> None:
    header = (
        f"# Tests of TaskFlow {fetching.TASKFLOW_VERSION}'s wheel (taskflow/tests/unit) that pass\n"
        "# on TaskFlow itself, as the conformance runner ids them.  Regenerate with:\n"
        "#   python tools/conformance/run.py --refresh-baseline\n"
    )
    BASELINE.write_text(header + "".join(f"{test}\n" for test in sorted(passing)))


def _is_gated(test: str, missing: set[str] = frozenset()) -> bool:
    module = results_mod.module_of(test)
    if any(module in classification.NEEDS.get(kind, ()) for kind in missing):
        return False
    return classification.kind_of_test(module, test) == classification.PUBLIC


def _report(
    run: results_mod.RunResults,
    baseline: set[str],
    modules: list[str],
    args: argparse.Namespace,
    missing: set[str],
) -> int:
    per_module: dict[str, Counter] = {m: Counter() for m in modules}
    for test, outcome in run.outcomes.items():
        per_module.setdefault(results_mod.module_of(test), Counter())[outcome] += 1
    # Tests the baseline expects: those of the selected modules (and, with -k,
    # those the run reached or whose module failed to import).
    expected = {t for t in baseline if results_mod.module_of(t) in per_module}
    if args.keyword:
        expected = {
            t
            for t in expected
            if t in run.outcomes or results_mod.module_of(t) in run.broken_modules
        }
    passed = run.passed()
    gated = {t for t in expected if _is_gated(t, missing)}
    print(f"{'module':40} {'kind':9} {'pass':>5} {'fail':>5} {'skip':>5}   gated passing")
    for module in sorted(per_module):
        counts = per_module[module]
        wanted = {t for t in gated if results_mod.module_of(t) == module}
        note = f"{len(wanted & passed)}/{len(wanted)}" if wanted else "-"
        if module in run.broken_modules:
            note += "  IMPORT ERROR"
        print(
            f"{module:40} {classification.kind_of(module):9} {counts['passed']:5} "
            f"{counts['failed']:5} {counts['skipped']:5}   {note}"
        )
    failing = sorted(gated - passed)
    shown = failing if not args.all else sorted(expected - passed)
    if args.show_failures:
        for test in shown:
            module = results_mod.module_of(test)
            detail = (
                run.details.get(test)
                or run.broken_modules.get(module)
                or ("not run (not collected)")
            )
            print(f"\n=== FAILED {test}\n{detail.rstrip()}")
    if args.causes:
        _print_causes(run, shown)
    if failing:
        print("\nGated tests that pass on TaskFlow and fail on flowengine:")
        for test in failing:
            print(f"  {test}")
    ungated = (expected - gated) - passed
    print(
        f"\nnot gated (internal/deferred) tests passing on TaskFlow, failing here: {len(ungated)}"
    )
    n_passed = len(gated & passed)
    print(f"conformance: {n_passed} passed, {len(gated) - n_passed} failed of {len(gated)}")
    return 1 if failing else 0


# Parts of error lines that differ between otherwise identical failures.
_VOLATILE = (
    (re.compile(r"0x[0-9a-f]+"), "0x..."),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
)
CAUSE_WIDTH = 200  # characters of an error line shown as a cause


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failure|Exit|Found|Mismatch\w*)\b")


def _cause(detail: str) -> str:
    """The error of a failure report: its last exception line and what follows it."""
    lines = [line.rstrip() for line in detail.splitlines() if line.strip()]
    pytest_errors = [line[4:].strip() for line in lines if line.startswith("E   ")]
    starts = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    if pytest_errors:
        cause = pytest_errors[-1]
    elif starts:
        cause = " ".join(line.strip() for line in lines[starts[-1] :])
    elif lines:
        cause = lines[-1].strip()
    else:
        return "not run (not collected)"
    for pattern, replacement in _VOLATILE:
        cause = pattern.sub(replacement, cause)
    return cause[:CAUSE_WIDTH]


def _print_causes(run: results_mod.RunResults, failing: list[str]) -> None:
    by_cause: dict[str, list[str]] = {}
    for test in failing:
        detail = run.details.get(test) or run.broken_modules.get(results_mod.module_of(test), "")
        by_cause.setdefault(_cause(detail), []).append(test)
    print("\nFailures by cause:")
    for cause, tests in sorted(by_cause.items(), key=lambda item: -len(item[1])):
        print(f"\n[{len(tests)}] {cause}")
        for test in tests:
            print(f"    {test}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parse(argv)
    started = time.monotonic()
    cache = fetching.cache_dir()
    unpacked = fetching.unpacked_tests(cache)
    if args.refresh_baseline and (args.module or args.keyword):
        raise SystemExit("--refresh-baseline runs every module: drop --module/-k")
    target = "taskflow" if args.refresh_baseline else "flowengine"
    env = dict(os.environ)
    if args.source:
        source = str(args.source.resolve())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    elif env.get("PYTHONPATH"):
        # Relative entries would resolve against the work tree: make them absolute.
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p
        )
    python = _taskflow_python(cache) if args.refresh_baseline else sys.executable
    (cache / "work").mkdir(parents=True, exist_ok=True)
    # One work tree per invocation: parallel runs (other worktrees) never share one.
    work = Path(tempfile.mkdtemp(prefix=f"{target}-", dir=cache / "work"))
    try:
        unit = rewriting.build_work_tree(unpacked, work, target)
        files = _module_files(unit, args.module)
        modules = [results_mod.module_of(str(Path(f).relative_to(unit))) for f in files]
        if not files:
            raise SystemExit(f"no TaskFlow test module matches {args.module}")
        print(f"{target} from {_engine_origin(python, env, target)}")
        with _servers(env) as missing:
            if args.refresh_baseline and missing:
                raise SystemExit(f"--refresh-baseline needs every server: no {sorted(missing)}")
            print(f"environment: {_environment()}")
            run = _run_pytest(python, work, files, args, env)
        if args.refresh_baseline:
            _write_baseline(run.passed())
            print(f"wrote {BASELINE} ({len(run.passed())} passing tests)")
            return 0
        status = _report(run, _read_baseline(), modules, args, missing)
    finally:
        if args.keep_work:
            print(f"work tree kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"(conformance run took {time.monotonic() - started:.0f} s)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
