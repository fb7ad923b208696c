"""Running the real ``flowengine`` command for the ``flows`` tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Factories of the test flows, as the command line names them.
FLOWS_MODULE = "tests.commands.ledger_flows"
#: Bound on one command (a flow here takes well under a second); a hang fails.
COMMAND_TIMEOUT_S = 60


def env() -> dict[str, str]:
    """The environment of a command: it imports this tree's flowengine and tests.

    A ``$FLOWENGINE_BACKEND`` of the developer's is left out: each test names its own.
    """
    variables = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    variables.pop("FLOWENGINE_BACKEND", None)
    return variables


def flowengine(
    *args: str, stdin: str | None = None, extra_env: dict[str, str] | None = None, cwd: Any = ROOT
) -> subprocess.CompletedProcess:
    """Run ``python -m flowengine ARGS`` to completion (in the repository by default)."""
    return subprocess.run(
        [sys.executable, "-m", "flowengine", *args],
        capture_output=True,
        text=True,
        env=dict(env(), **(extra_env or {})),
        cwd=cwd,
        input=stdin,
        timeout=COMMAND_TIMEOUT_S,
    )


def run_flow(
    backend: str, factory: str, ledger: Any, *extra: str, book: str = "tests"
) -> subprocess.CompletedProcess:
    """``flowengine run`` of a ledger flow, persisted in ``book``."""
    return flowengine(
        "run",
        f"{FLOWS_MODULE}:{factory}",
        "--backend",
        backend,
        "--book",
        book,
        "--store",
        f"ledger={ledger}",
        "--no-progress",
        *extra,
    )


def saved_uuid(proc: subprocess.CompletedProcess) -> str:
    """The flow detail uuid `flowengine run --backend` announced on stderr."""
    for line in proc.stderr.splitlines():
        if line.startswith("flowengine run: flow ") and " in logbook " in line:
            return line.split()[3]
    raise AssertionError(f"no saved flow announced; stderr:\n{proc.stderr}")


def listed(backend: str, *extra: str) -> list[dict[str, Any]]:
    """``flows list --json``."""
    proc = flowengine("flows", "list", "--backend", backend, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def shown(backend: str, flow: str) -> dict[str, Any]:
    """``flows show --json``."""
    proc = flowengine("flows", "show", flow, "--backend", backend, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def ledger(path: Any) -> list[str]:
    """What the tasks recorded, in order."""
    from tests.commands.ledger_flows import entries

    return entries(str(path))


class Background:
    """A ``flowengine`` process in the background, its stderr read line by line."""

    def __init__(self, *args: str) -> None:
        import queue
        import threading

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowengine", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)  # end of output

    def wait_for(self, text: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """The first stderr line containing ``text``; AssertionError at exit or timeout."""
        import queue
        import time

        deadline = time.monotonic() + timeout_s
        for line in self.lines:
            if text in line:
                return line
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {text!r} within {timeout_s} s; stderr: {self.lines}"
                ) from None
            if line is None:
                raise AssertionError(
                    f"exited ({self.proc.wait()}) before {text!r}; stderr: {self.lines}"
                )
            self.lines.append(line)
            if text in line:
                return line

    def kill9(self) -> None:
        """SIGKILL the process and reap it (no zombie left for the owner check)."""
        self.proc.kill()
        self.proc.wait(COMMAND_TIMEOUT_S)

    def close(self) -> None:
        """Kill it if it still runs; close its pipes."""
        if self.proc.poll() is None:
            self.kill9()
        self._reader.join(COMMAND_TIMEOUT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
