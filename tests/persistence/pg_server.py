"""A throwaway PostgreSQL cluster for tests (Debian's postgresql package).

``start()`` runs initdb in a temporary directory, starts ``postgres`` as a
child process on a free loopback port (unix socket in the same directory)
and returns a :class:`PgServer` once the server logs that it accepts
connections; ``stop()`` stops it and deletes everything. Raises
:class:`PgUnavailable` (with the reason) when it cannot.

The server gets SIGINT (fast shutdown) if the thread that started it dies,
so a test run killed by a timeout does not leave a server behind; data
directories such runs leave are removed by the next ``start()``.
"""

from __future__ import annotations

import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: initdb of an empty cluster takes ~1-2 s here; 60 s means something is wrong.
INITDB_TIMEOUT_S = 60
#: Bound on the server's start (it is ready in well under a second here).
START_TIMEOUT_S = 30
#: Bound on a fast shutdown before the server is killed outright.
STOP_TIMEOUT_S = 30
#: Data directories of dead servers older than this are removed by start();
#: younger ones may belong to a session that is still running initdb.
STALE_AGE_S = 600
#: What postgres logs once it accepts connections (lc_messages is C).
READY_LINE = "database system is ready to accept connections"
_PREFIX = "flowengine-pg-"
_PR_SET_PDEATHSIG = 1
#: Role created by initdb; trust authentication on loopback/socket only.
PG_USER = "flowengine"
# Durability is pointless for a throwaway cluster; these make it fast.
_FAST_OPTIONS = (
    "-c",
    "fsync=off",
    "-c",
    "full_page_writes=off",
    "-c",
    "synchronous_commit=off",
    "-c",
    "max_connections=50",
)
# For outage tests (restart() crashes the server): a commit is on disk when
# it returns, as on a production server, so a crash loses nothing committed.
_DURABLE_OPTIONS = ("-c", "max_connections=50")


class PgUnavailable(Exception):
    """The PostgreSQL test server cannot be started here (reason in the message)."""


@dataclass
class PgServer:
    """A running throwaway cluster."""

    url: str
    base_dir: str
    proc: subprocess.Popen = field(repr=False)
    start_time_s: float
    cmd: list[str] = field(default_factory=list, repr=False)
    as_user: dict = field(default_factory=dict, repr=False)

    def restart(self) -> None:
        """Crash the server (SIGQUIT: immediate shutdown, no checkpoint) and start it
        again on the same port and data; returns once it accepts connections."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            self.proc.wait(STOP_TIMEOUT_S)
        self.proc = _launch(self.cmd, self.base_dir, self.as_user)

    def stop(self) -> None:
        """Stop the server (fast shutdown, then kill) and delete its directory."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        shutil.rmtree(self.base_dir, ignore_errors=True)


def find_bindir() -> str:
    """Directory holding initdb and postgres (newest Debian version first)."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
        reverse=True,
    )
    found = shutil.which("initdb")
    if found:
        candidates.append(os.path.realpath(found))
    for initdb in candidates:
        bindir = os.path.dirname(initdb)
        if os.access(os.path.join(bindir, "postgres"), os.X_OK):
            return bindir
    raise PgUnavailable(
        "PostgreSQL is not installed (no initdb/postgres; Debian package 'postgresql')"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child after the switch to the 'postgres' user (a uid change
    # clears the setting, so it must come after): SIGINT when we die.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGINT)


def _remove_stale_dirs() -> None:
    """Delete data directories of servers that are gone (killed test runs)."""
    for base in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*")):
        try:
            if time.time() - os.path.getmtime(base) < STALE_AGE_S:
                continue
            with open(os.path.join(base, "data", "postmaster.pid")) as fp:
                os.kill(int(fp.readline()), 0)
            continue  # still running: someone else's
        except (OSError, ValueError):
            shutil.rmtree(base, ignore_errors=True)


def _user_args() -> dict:
    if os.geteuid() != 0:
        return {}
    # initdb and postgres refuse to run as root: use the package's user.
    try:
        owner = pwd.getpwnam("postgres")
    except KeyError:
        raise PgUnavailable("running as root and there is no 'postgres' user")
    return {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}


def _initdb(bindir: str, data: str, as_user: dict) -> None:
    cmd = [
        os.path.join(bindir, "initdb"),
        "-D",
        data,
        "-A",
        "trust",
        "-U",
        PG_USER,
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
        "--no-instructions",
    ]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=INITDB_TIMEOUT_S,
            check=False,
            cwd=os.path.dirname(data),
            **as_user,
        )
    except subprocess.TimeoutExpired:
        raise PgUnavailable(f"initdb did not finish within {INITDB_TIMEOUT_S} s")
    if proc.returncode != 0:
        raise PgUnavailable(
            f"initdb failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-800:]}"
        )


def _follow_log(proc: subprocess.Popen, log_path: str, ready: threading.Event) -> None:
    # Copy the server's stderr to its log file (so the pipe never fills) and
    # signal readiness when the ready line goes by.
    with open(log_path, "a") as log:
        for line in proc.stderr:
            log.write(line)
            log.flush()
            if READY_LINE in line:
                ready.set()


def start(
    durable: bool = False, configure: Callable[[str, dict], Sequence[str]] | None = None
) -> PgServer:
    """initdb + postgres on a free loopback port; PgUnavailable if impossible.

    ``durable``: committed transactions survive restart() (a crash), at the
    cost of speed; off, the cluster trades that for speed. ``configure(data_dir,
    as_user)`` runs after initdb (to write pg_hba.conf, certificates...) and
    returns more server options (``["-c", "ssl=on", ...]``).
    """
    bindir = find_bindir()
    as_user = _user_args()
    _remove_stale_dirs()
    began = time.monotonic()
    base_dir = tempfile.mkdtemp(prefix=_PREFIX)
    proc = None
    try:
        if as_user:
            os.chown(base_dir, as_user["user"], as_user["group"])
        data = os.path.join(base_dir, "data")
        _initdb(bindir, data, as_user)
        extra = list(configure(data, as_user)) if configure is not None else []
        port = _free_port()
        cmd = [
            os.path.join(bindir, "postgres"),
            "-D",
            data,
            "-p",
            str(port),
            "-k",
            base_dir,
            "-h",
            "127.0.0.1",
            "-c",
            "lc_messages=C",
            *(_DURABLE_OPTIONS if durable else _FAST_OPTIONS),
            *extra,
        ]
        proc = _launch(cmd, base_dir, as_user)
    except BaseException:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
        shutil.rmtree(base_dir, ignore_errors=True)
        raise
    return PgServer(
        url=f"postgresql://{PG_USER}@127.0.0.1:{port}/postgres",
        base_dir=base_dir,
        proc=proc,
        start_time_s=time.monotonic() - began,
        cmd=cmd,
        as_user=as_user,
    )


def _launch(cmd: list[str], base_dir: str, as_user: dict) -> subprocess.Popen:
    """Start postgres; return once it logged that it accepts connections."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=base_dir,
        preexec_fn=_die_with_parent,
        **as_user,
    )
    ready = threading.Event()
    log_path = os.path.join(base_dir, "server.log")
    threading.Thread(target=_follow_log, args=(proc, log_path, ready), daemon=True).start()
    if not ready.wait(START_TIMEOUT_S):
        with open(log_path) as fp:
            tail = fp.read()[-800:]
        if proc.poll() is None:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
        raise PgUnavailable(
            f"postgres did not accept connections within"
            f" {START_TIMEOUT_S} s (exit code {proc.poll()}): {tail}"
        )
    return proc


if __name__ == "__main__":  # manual check: start, print, stop
    server = start()
    print(f"up at {server.url} in {server.start_time_s:.2f} s")
    server.stop()
