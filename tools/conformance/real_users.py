#!/usr/bin/env python3
"""Run Octavia's and Masakari's TaskFlow-touching unit tests on flowengine (issue 40).

The projects come from PyPI into a cached virtualenv (never a dependency of
flowengine).  Each project's selected test modules run in one pytest process
with ``taskflow`` aliased to ``flowengine`` (every ``taskflow.X`` import is
the module ``flowengine.X``), and are compared with the committed baseline of
tests that pass on TaskFlow 6.5.0 itself.  Exit status is 1 iff a test that
passes on TaskFlow fails on flowengine.  See README.md next to this file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import fetching
import real_users_env
import real_users_selection
import results as results_mod

HERE = Path(__file__).resolve().parent
# Per-test bound (pytest-timeout): the slowest selected test takes a second.
TEST_TIMEOUT_S = 120
# Bound on one project's pytest process (about 40 s each here).
RUN_TIMEOUT_S = 900
ENGINES = ("flowengine", "taskflow")


def baseline_file(project: str) -> Path:
    """The committed list of the project's selected tests that pass on TaskFlow."""
    return HERE / f"{project}-{real_users_env.PROJECTS[project]}-passing.txt"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--project",
        action="append",
        choices=sorted(real_users_env.PROJECTS),
        help="run only this project (repeatable; default: all)",
    )
    parser.add_argument(
        "--source",
        type=Path,
        help="flowengine source tree to test (default: the flowengine this interpreter imports)",
    )
    parser.add_argument(
        "--baseline-run",
        action="store_true",
        help="also run the tests on TaskFlow now and gate on that run"
        " instead of the baseline files",
    )
    parser.add_argument(
        "--refresh-baseline",
        action="store_true",
        help="run the tests on TaskFlow and rewrite the baseline files",
    )
    parser.add_argument(
        "--show-failures",
        action="store_true",
        help="print the report of every gated test that fails",
    )
    parser.add_argument(
        "--keep-work", action="store_true", help="keep the work directory (its path is printed)"
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=TEST_TIMEOUT_S,
        help="per-test timeout in seconds (default %(default)s)",
    )
    return parser.parse_args(argv)


def _flowengine_source(args: argparse.Namespace) -> Path:
    if args.source:
        source = args.source.resolve()
    else:
        import flowengine  # the tree PYTHONPATH (or the editable install) names

        source = Path(flowengine.__file__).resolve().parents[1]
    if (
        not (source / "flowengine" / "__init__.py").is_file()
        or not (source / "setup.cfg").is_file()
    ):
        raise SystemExit(f"{source} is not a flowengine source tree (flowengine/, setup.cfg)")
    return source


def _work_tree(work: Path, source: Path) -> Path:
    """The directory put on the tests' sys.path: flowengine, the alias, the recorder."""
    path = work / "path"
    path.mkdir()
    (path / "flowengine").symlink_to(source / "flowengine", target_is_directory=True)
    shutil.copyfile(HERE / "taskflow_alias.py", path / "taskflow_alias.py")
    # The TaskFlow suite's recorder plugin: one JSON line per test phase.
    shutil.copyfile(HERE / "workdir_conftest.py", path / "conformance_recorder.py")
    (work / "pytest.ini").write_text(
        "[pytest]\n# Written by tools/conformance/real_users.py: the projects'"
        " own settings stay out.\npython_files = test_*.py\n"
    )
    return path


def _check_alias(python: Path, env: dict[str, str]) -> str:
    """Where flowengine comes from, after proving ``taskflow.X is flowengine.X``."""
    probe = (
        "import taskflow_alias, taskflow.engines, flowengine.engines, os;"
        "assert taskflow.engines is flowengine.engines, 'alias not in effect';"
        "print(os.path.dirname(os.path.realpath(flowengine.__file__)))"
    )
    proc = subprocess.run(
        [str(python), "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if proc.returncode:
        raise SystemExit(f"the taskflow alias does not work:\n{proc.stderr}")
    return proc.stdout.strip()


@dataclass
class ProjectRun:
    """One project's pytest process on one engine."""

    project: str
    engine: str
    results_file: Path
    log: Path
    process: subprocess.Popen[bytes]


def _start(
    python: Path,
    site: Path,
    work: Path,
    project: str,
    engine: str,
    files: list[Path],
    args: argparse.Namespace,
    env: dict[str, str],
) -> ProjectRun:
    results_file = work / f"{project}-{engine}.jsonl"
    log = work / f"{project}-{engine}.log"
    plugins = ["-p", "taskflow_alias"] if engine == "flowengine" else []
    cmd = [
        str(python),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(work / "pytest.ini"),
        "--rootdir",
        str(site),
        *plugins,
        "-p",
        "conformance_recorder",
        f"--timeout={args.timeout}",
        "--continue-on-collection-errors",
        *map(str, files),
    ]
    run_env = dict(env, FLOWENGINE_CONFORMANCE_RESULTS=str(results_file))
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, cwd=work, env=run_env, stdout=out, stderr=subprocess.STDOUT)
    return ProjectRun(project, engine, results_file, log, process)


def _finish(run: ProjectRun) -> results_mod.RunResults:
    try:
        code = run.process.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        run.process.kill()
        raise SystemExit(f"{run.project} on {run.engine} exceeded {RUN_TIMEOUT_S} s")
    # 0 all passed, 1 some failed; anything else means pytest itself broke.
    if code not in (0, 1):
        tail = run.log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"pytest ({run.project} on {run.engine}) exited {code}:\n{tail}")
    return results_mod.load(run.results_file)


def _read_baseline(project: str) -> set[str]:
    path = baseline_file(project)
    if not path.exists():
        raise SystemExit(f"no baseline {path.name}: run with --refresh-baseline")
    return {
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }


def _write_baseline(project: str, passing: set[str]) -> None:
    version = real_users_env.PROJECTS[project]
    header = (
        f"# {project} {version}'s TaskFlow-touching unit tests (selection: README.md)\n"
        f"# that pass on TaskFlow {fetching.TASKFLOW_VERSION} in the pinned venv"
        " (real-users-constraints.txt).\n"
        "# Regenerate with: python tools/conformance/real_users.py --refresh-baseline\n"
    )
    baseline_file(project).write_text(header + "".join(f"{t}\n" for t in sorted(passing)))


def _report(
    project: str, baseline: set[str], run: results_mod.RunResults, args: argparse.Namespace
) -> list[str]:
    """Print the project's line; return the baseline tests that fail on flowengine."""
    passed = run.passed()
    failing = sorted(baseline - passed)
    extra = len(passed - baseline)
    note = f" (+{extra} passing only on flowengine)" if extra else ""
    print(
        f"{project} {real_users_env.PROJECTS[project]}: TaskFlow passes {len(baseline)},"
        f" flowengine passes {len(baseline & passed)} of them{note}"
    )
    for module, why in sorted(run.broken_modules.items()):
        print(f"  IMPORT ERROR {module}: {why.strip().splitlines()[-1] if why.strip() else ''}")
    for test in failing:
        print(f"  FAILS ON FLOWENGINE {test}")
        if args.show_failures:
            print((run.details.get(test) or "not run (not collected)").rstrip())
    return failing


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parse(argv)
    started = time.monotonic()
    projects = args.project or sorted(real_users_env.PROJECTS)
    source = _flowengine_source(args)
    cache = fetching.cache_dir()
    python, built = real_users_env.ensure_venv(cache, source)
    print(
        f"venv {python.parents[1].name} ({'built now' if built else 'cached'},"
        f" {time.monotonic() - started:.0f} s)"
    )
    site = real_users_env.site_packages(python)
    (cache / "work").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="real-users-", dir=cache / "work"))
    try:
        # Only the work tree on the path: the caller's PYTHONPATH (another
        # flowengine, this repository's tests) must not leak into the venv.
        env = dict(os.environ, PYTHONPATH=str(_work_tree(work, source)))
        print(f"flowengine from {_check_alias(python, env)}")
        engines = ENGINES if (args.baseline_run or args.refresh_baseline) else ENGINES[:1]
        runs = []
        for project in projects:
            selected = real_users_selection.select(site, project)
            print(f"{project}: {len(selected)} test modules selected")
            files = [s.path for s in selected]
            # Projects and engines run side by side: separate processes, as
            # each project's global oslo.config registry must be.
            runs += [
                _start(python, site, work, project, engine, files, args, env) for engine in engines
            ]
        outcomes = {(run.project, run.engine): _finish(run) for run in runs}
        failing: list[str] = []
        gated = 0
        for project in projects:
            if args.refresh_baseline:
                _write_baseline(project, outcomes[project, "taskflow"].passed())
            baseline = (
                outcomes[project, "taskflow"].passed()
                if "taskflow" in engines
                else _read_baseline(project)
            )
            gated += len(baseline)
            failing += _report(project, baseline, outcomes[project, "flowengine"], args)
    finally:
        if args.keep_work:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"(real-users run took {time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(f"real users: {gated - len(failing)} passed, {len(failing)} failed of {gated}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
