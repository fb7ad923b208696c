"""The fast tier (``pytest -m "not broker"``, ``tox -e unit``): what keeps it in one process.

A test is outside the fast tier, marked ``broker``, when it starts a server
(Redis, RabbitMQ, PostgreSQL, ZooKeeper, etcd), or another process (a
``flowengine`` worker or command, a test helper script, a process pool), or
is marked ``slow``. tests/conftest.py marks most of them from the fixtures
they use (SERVER_FIXTURES) and the parameters they run with
(SERVER_PARAMETERS); a test that starts something another way carries the
mark itself.

With ``FLOWENGINE_NO_SERVERS=1`` (``tox -e unit`` sets it) starting any of
those fails the test with :class:`ServersForbidden`, naming what it tried to
start: a test that lacks the mark cannot slip into the fast tier unseen.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: The environment variable that forbids servers and processes (set by tox -e unit).
ENV = "FLOWENGINE_NO_SERVERS"

#: Fixtures (tests/conftest.py and the directories' conftest.py) that start a
#: server or worker processes, or hand out one that runs.
SERVER_FIXTURES = frozenset(
    {
        "redis_url",
        "amqp_url",
        "zookeeper_url",
        "zk_hosts",
        "etcd_url",
        "pg_url",
        "private_redis",
        "persistent_redis",
        "private_rabbitmq",
        "private_zookeeper",
        "private_etcd",
        "private_pg",
        "sentinel_cluster",
        "tls_sentinel_cluster",
        "tls_redis",
        "real_broker",
        "browser",
        "worker_pool_filesystem",
        "worker_pool_redis",
        "worker_pool_amqp",
        "traced_worker",
    }
)

#: Parameter values of parametrised fixtures (the engine, board, backend or
#: broker kinds) that start a server or processes when a test runs with them.
SERVER_PARAMETERS = frozenset(
    {
        "redis",
        "amqp",
        "postgresql",
        "zookeeper",
        "etcd",
        "parallel-processes",
        "worker-based-filesystem",
        "worker-based-redis",
        "worker-based-amqp",
    }
)

#: Executables that are servers (as tests/brokers.py and pg_server.py start them).
_SERVER_PROGRAMS = ("redis-server", "rabbitmq-server", "java", "etcd", "postgres", "initdb")


class ServersForbidden(RuntimeError):
    """A test of the fast tier started a server or a process: it must be marked ``broker``."""


def forbidden() -> bool:
    """Whether this run is the fast tier's (FLOWENGINE_NO_SERVERS=1)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


def refuse(what: str) -> None:
    """Raise ServersForbidden for starting ``what`` when servers are forbidden."""
    if forbidden():
        raise ServersForbidden(
            f"{ENV}=1 (the fast tier) and this test starts {what}: mark it"
            f" `broker` (see tests/fast_tier.py)"
        )


def _is_forbidden_command(args: Any) -> str | None:
    """What ``args`` (Popen's) would start that the fast tier may not, else None."""
    if isinstance(args, (str, bytes)):  # a shell command line (shell=True)
        line = os.fsdecode(args)
        if "python" in line or "flowengine" in line:
            return "a shell running Python: " + line[:200]
        args = line.split()
    argv: Sequence[str] = [args] if isinstance(args, os.PathLike) else args
    words = [os.fsdecode(a) for a in argv]
    if not words:
        return None
    program = os.path.basename(words[0].split()[0]) if words[0].strip() else ""
    if program.startswith("python") or words[0] == sys.executable:
        return "a Python process: " + " ".join(words)[:200]
    if program in _SERVER_PROGRAMS:
        return "a server: " + " ".join(words)[:200]
    if any("flowengine" in w or "python" in w for w in words[1:]):
        return "a process running flowengine: " + " ".join(words)[:200]
    return None


def install() -> None:
    """Under FLOWENGINE_NO_SERVERS=1, make Popen and multiprocessing refuse what the tier may not.

    Other commands (graphviz's ``dot``, ``ldconfig``) stay allowed: they
    start nothing that lives past the call.
    """
    if not forbidden():
        return
    popen_init = subprocess.Popen.__init__

    def guarded_popen(self: subprocess.Popen[Any], args: Any, *more: Any, **kw: Any) -> None:
        what = _is_forbidden_command(args)
        if what is not None:
            refuse(what)
        popen_init(self, args, *more, **kw)

    subprocess.Popen.__init__ = guarded_popen  # type: ignore[method-assign]
    process_start = multiprocessing.process.BaseProcess.start

    def guarded_start(self: multiprocessing.process.BaseProcess) -> None:
        refuse(f"a process ({type(self).__name__} {self.name})")
        process_start(self)

    multiprocessing.process.BaseProcess.start = guarded_start  # type: ignore[method-assign]
