"""A throwaway Redis primary, one replica and three Sentinels on loopback, for failover tests.

::

    with redis_sentinel.running_cluster() as cluster:
        conf = {"host": "127.0.0.1", "port": cluster.sentinel_ports[0],
                "sentinel": cluster.service, "sentinel_fallbacks": cluster.fallbacks}
        ...
        killed_at = cluster.kill_master()      # kill -9 the current master
        cluster.wait_for_new_master(old_port)  # until the Sentinels name another

Every server is a ``tests/brokers.py`` :class:`~brokers.BrokerProcess`
(free port, its own temporary directory, stopped at the end, reaped if the
test process dies). A Sentinel is Debian's ``redis-server <conf> --sentinel``.
The Sentinels decide a master is down after ``DOWN_AFTER_MS`` and two of
them must agree (quorum 2), so a failover takes a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import brokers
import redis
import redis_tls

#: The monitored service's name (Octavia's ``jobboard_redis_sentinel``).
SERVICE = "mymaster"
#: How long a master must stay silent before a Sentinel marks it down. Redis'
#: default is 30 s; 1 s makes a failover take seconds, and loopback pings of
#: a healthy master on a loaded 2-core machine stay far below it.
DOWN_AFTER_MS = 1000
#: A failover that stalls is retried after twice this (Redis' default: 3 min).
FAILOVER_TIMEOUT_MS = 3000
#: Bound on the Sentinels getting to know the replica and each other (hello
#: messages every 2 s, the master's INFO every 10 s): a broken setup fails.
DISCOVERY_TIMEOUT_S = 30.0
#: Bound on a failover: detection (1 s), agreement, election, promotion.
FAILOVER_WAIT_S = 60.0
#: A master waits 5 s by default before a full sync, for more replicas to
#: share it; there is one replica here.
NO_SYNC_DELAY = ["--repl-diskless-sync-delay", "0"]
#: Between two looks at the Sentinels' or a server's state.
POLL_S = 0.05


def _client(port: int, tls: redis_tls.Certificates | None = None) -> redis.Redis:
    return redis.Redis(
        "127.0.0.1",
        port,
        socket_timeout=2.0,
        decode_responses=True,
        **(redis_tls.client_kwargs(tls) if tls else {}),
    )


def _tls_options(tls: redis_tls.Certificates | None) -> list[str]:
    """TLS only, on every link (clients, replication, Sentinels): port 0, tls-port."""
    if tls is None:
        return []
    return [
        "--tls-cert-file",
        tls.server_cert,
        "--tls-key-file",
        tls.server_key,
        "--tls-ca-cert-file",
        tls.ca,
        "--tls-auth-clients",
        "yes",
        "--tls-replication",
        "yes",
    ]


def _sentinel_conf(master_port: int, port: int, wd: str, tls: bool) -> str:
    path = os.path.join(wd, "sentinel.conf")  # a Sentinel rewrites its conf: its own file
    listen = f"port 0\ntls-port {port}\n" if tls else f"port {port}\n"
    with open(path, "w") as fh:
        fh.write(
            f"{listen}bind 127.0.0.1\ndir {wd}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
    return path


def _ready(tls: redis_tls.Certificates | None):
    return (lambda port: brokers.tcp_open(port)) if tls else None


def _start_server(tls: redis_tls.Certificates | None, extra: list[str]) -> brokers.BrokerProcess:
    if tls is None:
        return brokers.start_redis(extra_args=[*NO_SYNC_DELAY, *extra])

    def command(binary: str, port: int, wd: str) -> list[str]:
        return [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            wd,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            *_tls_options(tls),
            *NO_SYNC_DELAY,
            *extra,
        ]

    return brokers.start_redis_like("redis-tls", command, ready=_ready(tls))


def _start_sentinel(master_port: int, tls: redis_tls.Certificates | None) -> brokers.BrokerProcess:
    def command(binary: str, port: int, wd: str) -> list[str]:
        return [
            binary,
            _sentinel_conf(master_port, port, wd, tls is not None),
            "--sentinel",
            "--daemonize",
            "no",
            "--logfile",
            "",
            *_tls_options(tls),
        ]

    return brokers.start_redis_like("redis-sentinel", command, ready=_ready(tls))


def _wait(what: str, done, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise brokers.BrokerUnavailable(
                f"Redis Sentinel setup: {what} not within {timeout_s} s"
            )
        time.sleep(POLL_S)


@dataclass
class SentinelCluster:
    """A primary, a replica and three Sentinels watching them as :data:`SERVICE`."""

    primary: brokers.BrokerProcess
    replica: brokers.BrokerProcess
    sentinels: list[brokers.BrokerProcess] = field(default_factory=list)
    service: str = SERVICE
    #: Set when every server and Sentinel speaks TLS only.
    tls: redis_tls.Certificates | None = None

    @property
    def sentinel_ports(self) -> list[int]:
        return [s.port for s in self.sentinels]

    @property
    def fallbacks(self) -> list[str]:
        """``sentinel_fallbacks`` for a board given the first Sentinel as host/port."""
        return [f"127.0.0.1:{port}" for port in self.sentinel_ports[1:]]

    def board_conf(self, **extra) -> dict:
        """TaskFlow's keys for a Redis board reaching the master through the Sentinels.

        With TLS: the ssl keys for the master, and the same in ``sentinel_kwargs``.
        """
        conf = {
            "board": "redis",
            "host": "127.0.0.1",
            "port": self.sentinel_ports[0],
            "sentinel": self.service,
            "sentinel_fallbacks": self.fallbacks,
        }
        if self.tls is not None:
            conf.update(redis_tls.client_kwargs(self.tls))
            conf["sentinel_kwargs"] = redis_tls.client_kwargs(self.tls)
        return {**conf, **extra}

    def client(self, port: int) -> redis.Redis:
        """A plain redis-py client of the server or Sentinel on ``port``."""
        return _client(port, self.tls)

    def _replication(self, port: int) -> dict:
        with contextlib.closing(self.client(port)) as c:
            return c.info("replication")

    def servers(self) -> list[brokers.BrokerProcess]:
        return [self.primary, self.replica]

    def master_port(self) -> int | None:
        """The master's port as the first Sentinel that answers names it."""
        for port in self.sentinel_ports:
            try:
                with contextlib.closing(self.client(port)) as c:
                    addr = c.sentinel_get_master_addr_by_name(self.service)
            except redis.RedisError:
                continue
            if addr:
                return int(addr[1])
        return None

    def _sentinels_know_everyone(self) -> bool:
        for port in self.sentinel_ports:
            with contextlib.closing(self.client(port)) as c:
                replicas = c.sentinel_slaves(self.service)
                peers = c.sentinel_sentinels(self.service)
            if len(peers) != len(self.sentinels) - 1:
                return False
            if not any(r["port"] == self.replica.port and not r["is_sdown"] for r in replicas):
                return False
        return True

    def kill_master(self) -> float:
        """kill -9 the current master; returns ``time.monotonic()`` of the kill."""
        port = self.master_port()
        server = next(s for s in self.servers() if s.port == port)
        server.kill()
        return time.monotonic()

    def wait_for_new_master(self, old_port: int, timeout_s: float = FAILOVER_WAIT_S) -> int:
        """Wait until every Sentinel names another master, and it says it is one."""

        def promoted() -> bool:
            ports = set()
            for port in self.sentinel_ports:
                with contextlib.closing(self.client(port)) as c:
                    addr = c.sentinel_get_master_addr_by_name(self.service)
                ports.add(int(addr[1]) if addr else None)
            if len(ports) != 1 or ports == {old_port}:
                return False
            new = ports.pop()
            return new is not None and self._replication(new).get("role") == "master"

        _wait("a failover", promoted, timeout_s)
        port = self.master_port()
        assert port is not None
        return port

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary]:
            server.stop()


def start_cluster(tls: redis_tls.Certificates | None = None) -> SentinelCluster:
    """Start the primary, the replica (in sync), then the Sentinels (knowing everyone).

    With ``tls`` every link is TLS with client certificates (``tls-auth-clients``,
    ``tls-replication``): clients, replication, and the Sentinels' own links.
    """
    primary = _start_server(tls, [])
    started = [primary]
    try:
        replica = _start_server(tls, ["--replicaof", "127.0.0.1", str(primary.port)])
        started.append(replica)
        cluster = SentinelCluster(primary, replica, tls=tls)
        _wait(
            "the replica's sync",
            lambda: cluster._replication(replica.port).get("master_link_status") == "up",
            DISCOVERY_TIMEOUT_S,
        )
        for _ in range(3):
            cluster.sentinels.append(_start_sentinel(primary.port, tls))
            started.append(cluster.sentinels[-1])
        _wait(
            "the Sentinels' discovery of the replica and of each other",
            cluster._sentinels_know_everyone,
            DISCOVERY_TIMEOUT_S,
        )
        return cluster
    except BaseException:
        for server in reversed(started):
            server.stop()
        raise


@contextlib.contextmanager
def running_cluster(tls: redis_tls.Certificates | None = None) -> Iterator[SentinelCluster]:
    """Context manager: a :class:`SentinelCluster` for the duration of the block."""
    cluster = start_cluster(tls)
    try:
        yield cluster
    finally:
        cluster.stop()
