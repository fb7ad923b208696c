"""Start ``child.py`` processes and read their announcements with bounded waits."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
#: Bound on any wait for a child (start-up plus a short flow is ~0.5 s idle, several
#: seconds on a loaded 2-core machine);
#: reached only when something is broken, so the test fails instead of hanging.
CHILD_WAIT_S = 60.0


class Child:
    """One child.py process with line-by-line access to its stdout."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = dict(os.environ, PYTHONPATH=ROOT)
        full_env.pop("FLOWENGINE_TEST_BLOCK_IN", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self._buffer = b""

    def wait_for(self, prefix: str, timeout: float = CHILD_WAIT_S) -> str:
        """First stdout line starting with ``prefix``; AssertionError on timeout or exit."""
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if line.startswith(prefix):
                return line
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise AssertionError(f"no {prefix!r} line within {timeout} s; got {self.lines}")
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self.proc.wait(timeout=CHILD_WAIT_S)
                    raise AssertionError(
                        f"child exited {self.proc.returncode} before"
                        f" {prefix!r}; stdout {self.lines}; stderr:\n"
                        f"{self.proc.stderr.read().decode()[-3000:]}"
                    )
                self._buffer += chunk
                *complete, self._buffer = self._buffer.split(b"\n")
                for raw in complete:
                    line = raw.decode()
                    self.lines.append(line)
                    if line.startswith(prefix):
                        return line

    def release(self) -> None:
        """Send the start-gate line (``chain`` mode waits for it)."""
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def kill9(self) -> None:
        """SIGKILL the child and reap it."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=CHILD_WAIT_S)
        self.close()

    def finish(self) -> str:
        """Wait for a normal exit; return the final ``STATE`` value."""
        state = self.wait_for("STATE ").split()[1]
        self.proc.wait(timeout=CHILD_WAIT_S)
        assert self.proc.returncode == 0, self.proc.stderr.read().decode()[-3000:]
        self.close()
        return state

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=CHILD_WAIT_S)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
