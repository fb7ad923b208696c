"""Throwaway message brokers and coordination servers for the test-suite (and the benchmarks).

Starts ``redis-server``, ``rabbitmq-server`` and ZooKeeper (Debian's
``zookeeper`` package, run on the JVM) as child processes bound to
free loopback ports, with every file they write under one temporary folder,
waits (bounded) until each accepts a real protocol handshake, and stops them
again.  Nothing here touches a system-wide broker or its data.

Used by ``tests/conftest.py``; importable on its own::

    with brokers.running_redis() as b:
        print(b.url)

Outage tests can take a broker down and bring it back on the same port with
the same data: ``b.kill()`` / ``b.start()`` (or ``b.restart()``).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kombu.utils.url import maybe_sanitize_url

# Redis is up in ~50 ms; 15 s leaves room for a loaded 2-core CI machine.
REDIS_START_TIMEOUT_S = 15.0
# RabbitMQ (Erlang VM boot + Mnesia + vhost setup) takes ~5 s here; 90 s
# covers a cold, busy machine without letting a broken install hang CI.
RABBITMQ_START_TIMEOUT_S = 90.0
# epmd answers within milliseconds; it only has to bind its port.
EPMD_START_TIMEOUT_S = 10.0
# ZooKeeper (JVM start + an empty data dir) serves in ~1 s here; 60 s covers
# a cold JIT on a loaded 2-core machine.
ZOOKEEPER_START_TIMEOUT_S = 60.0
# etcd (one Go binary, an empty data dir) serves in ~0.5 s; 30 s covers a
# loaded 2-core machine fsyncing its first WAL segment.
ETCD_START_TIMEOUT_S = 30.0
# The test server's heap: tests keep a few thousand small znodes at most,
# and the default (a quarter of RAM) would take memory from the other tests.
ZOOKEEPER_HEAP_MB = 256
# A graceful SIGTERM stop of RabbitMQ takes ~1 s; after this we SIGKILL.
STOP_TIMEOUT_S = 15.0
# Between readiness probes: short, the probes themselves are cheap.
PROBE_INTERVAL_S = 0.05
# How many times a first start is retried with fresh ports (a free port can
# be taken by someone else between choosing it and the server binding it).
START_ATTEMPTS = 3

# Where Debian puts the real RabbitMQ start script; /usr/sbin/rabbitmq-server
# is a wrapper that su's to the rabbitmq user, which could not write our temp dir.
RABBITMQ_SCRIPT_CANDIDATES = (
    "/usr/lib/rabbitmq/bin/rabbitmq-server",
    "/usr/lib/rabbitmq/sbin/rabbitmq-server",
)

# Runs beside the brokers and reads, one per line, the process-group ids of
# what we start, from a pipe only this (test) process writes to.  If the test
# process dies without stopping its brokers (kill -9, os._exit on a timeout)
# the pipe closes and the reaper kills those groups: no broker outlives us.
_REAPER_CODE = """
import os, signal, sys
pgids = [int(line) for line in sys.stdin.buffer]
for pgid in pgids:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


# Where Debian's zookeeper package puts the server (libzookeeper-java); its
# manifest names the jars it needs, so this one jar is the whole classpath.
ZOOKEEPER_JAR_CANDIDATES = (
    "/usr/share/java/zookeeper.jar",
    "/usr/share/zookeeper/zookeeper.jar",
)


class BrokerUnavailable(RuntimeError):
    """A broker could not be started (binary missing, or it did not come up)."""


@dataclass
class _Launch:
    """One process of a broker: how to start it and how to tell it is ready."""

    cmd: list[str]
    log_path: str
    env: dict[str, str] | None
    ready: Callable[[], bool]
    timeout_s: float


@dataclass
class BrokerProcess:
    """A throwaway broker: its URL, and start/kill/stop for its processes."""

    name: str
    url: str
    port: int
    workdir: str
    log_path: str
    launches: list[_Launch] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    start_time_s: float = 0.0
    owns_workdir: bool = True
    _reaper: subprocess.Popen | None = None

    def log_tail(self, max_chars: int = 3000) -> str:
        """The end of the broker's log, for error messages."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-max_chars:]
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        """True while every process we started for this broker still runs."""
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def start(self) -> None:
        """Start (or restart, same port and data) every process; wait until ready."""
        started = time.monotonic()
        for launch in self.launches[len(self.procs) :]:
            proc = _popen(launch.cmd, launch.log_path, launch.env, self.workdir)
            self.procs.append(proc)
            self._watch(proc)
            if not _wait_until(launch.ready, self.alive, launch.timeout_s):
                what = "exited" if proc.poll() is not None else f"not ready in {launch.timeout_s} s"
                raise BrokerUnavailable(
                    f"{self.name}: {os.path.basename(launch.cmd[0])} {what}; log:\n"
                    + self.log_tail()
                )
        self.start_time_s = time.monotonic() - started

    def kill(self) -> None:
        """Take the server down abruptly (SIGKILL), keeping its port, data and helpers.

        For outage tests; ``start()`` brings it back on the same URL.
        """
        if len(self.procs) == len(self.launches) and self.procs:
            proc = self.procs.pop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> None:
        """kill() then start()."""
        self.kill()
        self.start()

    def restart_gracefully(self) -> None:
        """Stop the server with SIGTERM, as an operator would, then start() it again.

        Same port, data and helpers as kill()/start(); a server stopped this
        way has written down everything it was told (RabbitMQ: every queue
        and binding declared so far; Redis: its append-only file).
        """
        if len(self.procs) == len(self.launches) and self.procs:
            _terminate_group(self.procs.pop())
        self.start()

    def stop(self) -> None:
        """Stop every process (SIGTERM, SIGKILL after STOP_TIMEOUT_S) and clean up."""
        # Reverse start order: the server first, its helpers (epmd) last.
        for proc in reversed(self.procs):
            _terminate_group(proc)
        self.procs.clear()
        if self._reaper is not None:
            self._reaper.stdin.close()  # its groups are gone: it kills nothing
            self._reaper.wait(timeout=STOP_TIMEOUT_S)
            self._reaper = None
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _watch(self, proc: subprocess.Popen) -> None:
        if self._reaper is None:
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER_CODE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._reaper.stdin.write(f"{proc.pid}\n".encode())
        self._reaper.stdin.flush()


def _terminate_group(proc: subprocess.Popen) -> None:
    # Each process runs in its own session, so its whole group (the rabbitmq
    # shell script and the beam.smp under it) is signalled at once.
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)


def _popen(cmd: list[str], log_path: str, env: dict | None, cwd: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


def _wait_until(ready: Callable[[], bool], alive: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            return False
        if ready():
            return True
        time.sleep(PROBE_INTERVAL_S)
    return False


#: Lowest port free_port() picks: above the well-known and registered ports
#: services commonly listen on.
LOWEST_SERVER_PORT = 10000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections' own ports)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range.

    Below it, no outgoing connection of any process is given the port as
    its own while a server is down: the fault tests kill a server and start
    it again on the same port, and a client retrying a dead server on a port
    of the ephemeral range can even be connected to itself (TCP's
    simultaneous open), which held a ZooKeeper ensemble's election and kept
    a killed node from starting again.
    """
    low = _ephemeral_low()
    if low - LOWEST_SERVER_PORT > 1000:
        for _ in range(100):
            port = random.randrange(LOWEST_SERVER_PORT, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str | None:
    """Path of redis-server, or None."""
    return shutil.which("redis-server")


def rabbitmq_binary() -> str | None:
    """Path of the real rabbitmq-server start script, or None."""
    for path in RABBITMQ_SCRIPT_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("rabbitmq-server")


def zookeeper_command() -> list[str] | None:
    """``java -cp zookeeper.jar`` (Debian's package) as an argument list, or None."""
    java = shutil.which("java")
    jar = next((p for p in ZOOKEEPER_JAR_CANDIDATES if os.path.isfile(p)), None)
    if java is None or jar is None:
        return None
    return [java, f"-Xmx{ZOOKEEPER_HEAP_MB}m", "-cp", jar]


def etcd_binary() -> str | None:
    """Path of etcd (Debian's ``etcd-server``), or None."""
    return shutil.which("etcd")


def _etcd_serving(port: int) -> bool:
    # /health answers {"health":"true"} once the member has elected itself leader.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
        return b'"health":"true"' in reply
    except OSError:
        return False


def tcp_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _zookeeper_serving(port: int) -> bool:
    # 'srvr' answers with the server's mode only once it serves requests
    # (before that: "This ZooKeeper instance is not currently serving").
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"srvr")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            return b"Mode:" in reply
    except OSError:
        return False


def _amqp_login(port: int) -> bool:
    # A full AMQP login: the listener opens before the default vhost exists.
    import amqp  # kombu's own dependency

    try:
        conn = amqp.Connection(f"127.0.0.1:{port}", connect_timeout=2)
        conn.connect()
        conn.close()
        return True
    except Exception:
        return False


def _start_with_retries(make: Callable[[], BrokerProcess]) -> BrokerProcess:
    errors = []
    for _ in range(START_ATTEMPTS):
        broker = make()
        try:
            broker.start()
            return broker
        except BrokerUnavailable as exc:
            errors.append(str(exc))
            broker.stop()
    raise BrokerUnavailable("\n---\n".join(errors))


def start_redis(
    timeout_s: float = REDIS_START_TIMEOUT_S,
    *,
    persistent: bool = False,
    extra_args: Sequence[str] = (),
) -> BrokerProcess:
    """Start redis-server on a free loopback port; raise BrokerUnavailable.

    ``persistent=True`` turns on the append-only file with an fsync per write,
    so what was written survives ``kill()`` (for durable-topology tests).
    ``extra_args`` end its command line (``--replicaof 127.0.0.1 6379``...).
    """

    def command(binary: str, port: int, wd: str) -> list[str]:
        return [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            wd,
            # no persistence (a throwaway broker) unless asked for
            "--save",
            "",
            "--appendonly",
            "yes" if persistent else "no",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            "",
            *extra_args,
        ]

    return start_redis_like("redis", command, timeout_s=timeout_s)


def start_redis_like(
    name: str,
    command: Callable[[str, int, str], list[str]],
    *,
    ready: Callable[[int], bool] | None = None,
    timeout_s: float = REDIS_START_TIMEOUT_S,
) -> BrokerProcess:
    """Start a redis-server of some kind (replica, Sentinel, TLS) on a free loopback port.

    ``command(binary, port, workdir)`` gives its command line; it is ready when
    ``ready(port)`` (default: it answers PING on ``port``). Raises BrokerUnavailable.
    """
    binary = redis_binary()
    if binary is None:
        raise BrokerUnavailable("redis-server not found on PATH (apt-get install redis-server)")
    is_ready = ready or _redis_ping

    def make() -> BrokerProcess:
        wd = tempfile.mkdtemp(prefix=f"flowengine-{name}-")
        port = free_port()
        log = os.path.join(wd, f"{name}.log")
        return BrokerProcess(
            name,
            f"redis://127.0.0.1:{port}/0",
            port,
            wd,
            log,
            launches=[
                _Launch(command(binary, port, wd), log, None, lambda: is_ready(port), timeout_s)
            ],
        )

    return _start_with_retries(make)


def start_zookeeper(timeout_s: float = ZOOKEEPER_START_TIMEOUT_S) -> BrokerProcess:
    """Start a standalone ZooKeeper on a free loopback port; raise BrokerUnavailable.

    Its data (snapshots and transaction log, synced on every write) lives in
    the broker's temp dir, so ``kill()`` / ``start()`` keeps every znode
    (sessions survive too, if the client reconnects within their timeout).
    Its URL is ``zookeeper://127.0.0.1:PORT``; ``hosts`` for kazoo is
    ``127.0.0.1:PORT``.
    """
    base = zookeeper_command()
    if base is None:
        raise BrokerUnavailable(
            "ZooKeeper not found (apt-get install zookeeper: it needs"
            " java and /usr/share/java/zookeeper.jar)"
        )

    def make() -> BrokerProcess:
        wd = tempfile.mkdtemp(prefix="flowengine-zookeeper-")
        port = free_port()
        conf = os.path.join(wd, "zoo.cfg")
        with open(conf, "w") as f:
            f.write(
                f"tickTime=500\n"  # sessions may time out in 1-10 s (2..20 ticks)
                f"dataDir={wd}/data\n"
                f"clientPort={port}\nclientPortAddress=127.0.0.1\n"
                "admin.enableServer=false\n"  # no HTTP admin port to collide on
                "4lw.commands.whitelist=srvr,ruok,envi\n"  # readiness; kazoo server_version()
                "maxClientCnxns=0\n"
            )  # the fault tests open many sessions
        log = os.path.join(wd, "zookeeper.log")
        cmd = [*base, "org.apache.zookeeper.server.ZooKeeperServerMain", conf]
        return BrokerProcess(
            "zookeeper",
            f"zookeeper://127.0.0.1:{port}",
            port,
            wd,
            log,
            launches=[_Launch(cmd, log, None, lambda: _zookeeper_serving(port), timeout_s)],
        )

    return _start_with_retries(make)


def start_etcd(timeout_s: float = ETCD_START_TIMEOUT_S) -> BrokerProcess:
    """Start a one-member etcd on free loopback ports; raise BrokerUnavailable.

    Its data (WAL and snapshots) lives in the broker's temp dir, so ``kill()``
    / ``start()`` keeps every key and lease. Its URL is ``etcd://127.0.0.1:PORT``
    (the client port; the peer port is another free one).
    """
    binary = etcd_binary()
    if binary is None:
        raise BrokerUnavailable("etcd not found on PATH (apt-get install etcd-server)")

    def make() -> BrokerProcess:
        wd = tempfile.mkdtemp(prefix="flowengine-etcd-")
        port, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        log = os.path.join(wd, "etcd.log")
        cmd = [
            binary,
            "--name",
            "test",
            "--data-dir",
            os.path.join(wd, "data"),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"test={peer_url}",
            "--log-level",
            "warn",
        ]
        return BrokerProcess(
            "etcd",
            f"etcd://127.0.0.1:{port}",
            port,
            wd,
            log,
            launches=[_Launch(cmd, log, None, lambda: _etcd_serving(port), timeout_s)],
        )

    return _start_with_retries(make)


def _rabbitmq_env(wd: str, port: int, dist_port: int, epmd_port: int) -> dict[str, str]:
    conf = os.path.join(wd, "rabbitmq.conf")
    with open(conf, "w") as f:
        f.write(
            f"listeners.tcp.default = 127.0.0.1:{port}\n"
            # guest may log in, but only over loopback (the default, kept explicit).
            "loopback_users.guest = true\n"
            # Tests use little disk; don't block publishers on a small tmpfs.
            "disk_free_limit.absolute = 1MB\n"
        )
    plugins = os.path.join(wd, "enabled_plugins")
    with open(plugins, "w") as f:
        f.write("[].\n")  # no management plugin: faster boot, no extra ports
    conf_env = os.path.join(wd, "rabbitmq-env.conf")
    open(conf_env, "w").close()  # so /etc/rabbitmq/rabbitmq-env.conf is not read
    env = dict(os.environ)
    env.update(
        {
            # Erlang writes its cookie to $HOME: keep it in the temp dir.
            "HOME": wd,
            "RABBITMQ_NODENAME": f"flowengine-test-{port}@localhost",
            "RABBITMQ_USE_LONGNAME": "",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONFIG_FILE": conf,
            "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(wd, "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": conf_env,
            "RABBITMQ_ENABLED_PLUGINS_FILE": plugins,
            "RABBITMQ_MNESIA_BASE": os.path.join(wd, "mnesia"),
            "RABBITMQ_LOG_BASE": os.path.join(wd, "log"),
            "RABBITMQ_PID_FILE": os.path.join(wd, "rabbitmq.pid"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": os.path.join(wd, "plugins-expand"),
            "RABBITMQ_FEATURE_FLAGS_FILE": os.path.join(wd, "feature_flags"),
            # A private epmd (started by us) so we neither need nor disturb a
            # system one on 4369, and Erlang distribution stays on loopback.
            "ERL_EPMD_PORT": str(epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
    )
    return env


def start_rabbitmq(timeout_s: float = RABBITMQ_START_TIMEOUT_S) -> BrokerProcess:
    """Start rabbitmq-server on a free loopback port; raise BrokerUnavailable."""
    script = rabbitmq_binary()
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    if script is None or not os.access(epmd, os.X_OK):
        raise BrokerUnavailable(
            "rabbitmq-server (or Erlang's epmd) not found (apt-get install rabbitmq-server)"
        )

    def make() -> BrokerProcess:
        wd = tempfile.mkdtemp(prefix="flowengine-rabbitmq-")
        port, dist_port, epmd_port = free_port(), free_port(), free_port()
        env = _rabbitmq_env(wd, port, dist_port, epmd_port)
        log = os.path.join(wd, "rabbitmq.out")
        return BrokerProcess(
            "rabbitmq",
            f"amqp://guest:guest@127.0.0.1:{port}//",
            port,
            wd,
            log,
            launches=[
                # epmd in the foreground (no -daemon): our child, stopped with us.
                _Launch(
                    [epmd, "-port", str(epmd_port), "-address", "127.0.0.1"],
                    os.path.join(wd, "epmd.log"),
                    env,
                    lambda: tcp_open(epmd_port),
                    EPMD_START_TIMEOUT_S,
                ),
                _Launch([script], log, env, lambda: _amqp_login(port), timeout_s),
            ],
        )

    return _start_with_retries(make)


@contextlib.contextmanager
def running_redis() -> Iterator[BrokerProcess]:
    """Context manager: a throwaway redis-server for the duration of the block."""
    broker = start_redis()
    try:
        yield broker
    finally:
        broker.stop()


@contextlib.contextmanager
def running_rabbitmq() -> Iterator[BrokerProcess]:
    """Context manager: a throwaway rabbitmq-server for the duration of the block."""
    broker = start_rabbitmq()
    try:
        yield broker
    finally:
        broker.stop()


@contextlib.contextmanager
def running_zookeeper() -> Iterator[BrokerProcess]:
    """Context manager: a throwaway ZooKeeper for the duration of the block."""
    broker = start_zookeeper()
    try:
        yield broker
    finally:
        broker.stop()


#: The environment variables TaskFlow's own tests read for each server's port.
TASKFLOW_PORT_VARS = {
    "redis": "TASKFLOW_TEST_REDIS_PORT",
    "zookeeper": "TASKFLOW_TEST_ZOOKEEPER_PORT",
    "etcd": "TASKFLOW_TEST_ETCD_PORT",
}
_STARTERS: dict[str, Callable[[], BrokerProcess]] = {
    "redis": start_redis,
    "zookeeper": start_zookeeper,
    "etcd": start_etcd,
}


@contextlib.contextmanager
def taskflow_test_servers(
    kinds: tuple[str, ...] = ("redis", "zookeeper", "etcd"),
) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """Throwaway servers for TaskFlow's own unit tests (tools/conformance).

    Yields ``(env, unavailable)``: the ``TASKFLOW_TEST_*_PORT`` variables of
    the servers that started, and for each that could not, why. Stopped
    when the block ends.
    """
    env: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    started: list[BrokerProcess] = []
    try:
        for kind in kinds:
            try:
                server = _STARTERS[kind]()
            except BrokerUnavailable as e:
                unavailable[kind] = str(e).splitlines()[0]
                continue
            started.append(server)
            env[TASKFLOW_PORT_VARS[kind]] = str(server.port)
        yield env, unavailable
    finally:
        for server in started:
            server.stop()


def main() -> int:
    """Start and stop each server once, printing the times (used by .ci/run)."""
    for starter in (start_redis, start_rabbitmq, start_zookeeper, start_etcd):
        b = starter()
        # CI logs are public: print the URL without its password.
        print(f"{b.name}: {maybe_sanitize_url(b.url)} up in {b.start_time_s:.2f} s", flush=True)
        t = time.monotonic()
        b.stop()
        print(f"{b.name}: stopped in {time.monotonic() - t:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
