"""A throwaway PostgreSQL cluster for tests (Debian's postgresql package).

``start()`` runs initdb in a temporary directory, starts the server with
pg_ctl on a free loopback port (unix socket in the same directory) and
returns a :class:`PgServer`; ``stop()`` stops it and deletes everything.
Raises :class:`PgUnavailable` (with the reason) when it cannot.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

#: initdb of an empty cluster takes ~1-2 s here; 60 s means something is wrong.
INITDB_TIMEOUT_S = 60
#: pg_ctl -w waits at most this long for the server to accept connections.
START_TIMEOUT_S = 30
#: Bound on stopping (immediate mode: no checkpoint, the data is thrown away).
STOP_TIMEOUT_S = 30
#: Role created by initdb; trust authentication on loopback/socket only.
PG_USER = "flowengine"
# Durability is pointless for a throwaway cluster; these make it fast.
_FAST_OPTIONS = ("-c fsync=off -c full_page_writes=off -c synchronous_commit=off"
                 " -c max_connections=50")


class PgUnavailable(Exception):
    """The PostgreSQL test server cannot be started here (reason in the message)."""


@dataclass
class PgServer:
    """A running throwaway cluster."""

    url: str
    base_dir: str
    bindir: str
    run_as: list[str]
    start_time_s: float

    def stop(self) -> None:
        """Stop the server (immediate) and delete its directory."""
        subprocess.run(self.run_as + [os.path.join(self.bindir, "pg_ctl"), "-D",
                                      os.path.join(self.base_dir, "data"), "-m", "immediate",
                                      "-w", "-t", str(STOP_TIMEOUT_S), "stop"],
                       capture_output=True, timeout=STOP_TIMEOUT_S + 5, check=False)
        shutil.rmtree(self.base_dir, ignore_errors=True)


def find_bindir() -> str:
    """Directory holding initdb and pg_ctl (newest Debian version first)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
                        reverse=True)
    found = shutil.which("initdb")
    if found:
        candidates.append(os.path.realpath(found))
    for initdb in candidates:
        bindir = os.path.dirname(initdb)
        if os.access(os.path.join(bindir, "pg_ctl"), os.X_OK):
            return bindir
    raise PgUnavailable("PostgreSQL is not installed (no initdb/pg_ctl; Debian package"
                        " 'postgresql')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], timeout: float, what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise PgUnavailable(f"{what} did not finish within {timeout} s")
    if proc.returncode != 0:
        raise PgUnavailable(f"{what} failed ({proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip()[-800:]}")


def start() -> PgServer:
    """initdb + pg_ctl start on a free loopback port; PgUnavailable if impossible."""
    bindir = find_bindir()
    run_as: list[str] = []
    owner = None
    if os.geteuid() == 0:
        # initdb refuses to run as root: use the package's 'postgres' user.
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise PgUnavailable("running as root and there is no 'postgres' user")
        run_as = ["runuser", "-u", "postgres", "--"]
    began = time.monotonic()
    base_dir = tempfile.mkdtemp(prefix="flowengine-pg-")
    try:
        if owner is not None:
            os.chown(base_dir, owner.pw_uid, owner.pw_gid)
        data = os.path.join(base_dir, "data")
        _run(run_as + [os.path.join(bindir, "initdb"), "-D", data, "-A", "trust",
                       "-U", PG_USER, "-E", "UTF8", "--locale=C", "--no-sync",
                       "--no-instructions"], INITDB_TIMEOUT_S, "initdb")
        port = _free_port()
        options = f"-p {port} -k {base_dir} -h 127.0.0.1 {_FAST_OPTIONS}"
        _run(run_as + [os.path.join(bindir, "pg_ctl"), "-D", data, "-l",
                       os.path.join(base_dir, "server.log"), "-o", options, "-w",
                       "-t", str(START_TIMEOUT_S), "start"],
             START_TIMEOUT_S + 10, "pg_ctl start")
    except BaseException:
        shutil.rmtree(base_dir, ignore_errors=True)
        raise
    return PgServer(url=f"postgresql://{PG_USER}@127.0.0.1:{port}/postgres",
                    base_dir=base_dir, bindir=bindir, run_as=run_as,
                    start_time_s=time.monotonic() - began)


if __name__ == "__main__":  # manual check: start, print, stop
    server = start()
    print(f"up at {server.url} in {server.start_time_s:.2f} s")
    server.stop()
