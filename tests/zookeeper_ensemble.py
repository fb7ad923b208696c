"""A throwaway 3-node ZooKeeper ensemble on loopback, for the failover tests.

Each node is Debian's ZooKeeper (``brokers.zookeeper_command()``) with its
own ``myid``, data directory, client port and peer/election ports, and the
same ``server.N=`` lines. The three JVMs start at once (a node serves only
once a quorum has elected a leader, so one at a time would never come up).
The four-letter word ``srvr`` tells each node's role (``Mode: leader``);
:meth:`Ensemble.kill_leader` kills that node with SIGKILL::

    ensemble = zookeeper_ensemble.start()
    conf = {"hosts": ensemble.hosts}       # 127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
    killed, at = ensemble.kill_leader()
    ensemble.wait_for_leader(excluding=killed)
    ensemble.stop()

A node may speak TLS to clients as well (``tls=``): a ``secureClientPort``
served by Netty with PEM files (:func:`start`'s ``tls`` argument).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field

import brokers

#: Nodes of the ensemble: the smallest that survives the loss of one.
NODES = 3
#: Ticks of 250 ms: a follower notices a dead leader and the ensemble elects
#: another within a second or two on loopback; sessions may last 0.5-5 s.
TICK_MS = 250
#: Ticks a follower has to connect and sync with a leader (5 s): the JVMs of
#: a loaded 2-core machine start slowly.
INIT_LIMIT_TICKS = 20
#: Ticks a follower may fall behind before the leader drops it.
SYNC_LIMIT_TICKS = 8
#: Sessions the nodes grant: up to 10 s (40 ticks), so a board's session can
#: outlast an election.
MAX_SESSION_TICKS = 40
#: Three JVMs starting at once on two cores, plus the first election.
ENSEMBLE_START_TIMEOUT_S = 90.0
#: Bound on electing a new leader after one was killed (a bug if reached).
ELECTION_TIMEOUT_S = 60.0
#: Jars the Netty connection factory needs besides those the ZooKeeper jar's
#: manifest names (Debian's libnetty-java ships them).
NETTY_EXTRA_JARS = ("/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar")
#: An SLF4J binding, so that a node logs at all: the ZooKeeper jar's manifest
#: names only slf4j-api, which alone discards every line (Debian's
#: libslf4j-java ships this one; without it the nodes run silent).
SLF4J_SIMPLE_JAR = "/usr/share/java/slf4j-simple.jar"
#: slf4j-simple's settings: INFO with milliseconds, to stdout (the node's log file).
SLF4J_SIMPLE_PROPERTIES = (
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.logFile=System.out",
)


@dataclass(frozen=True)
class NodeTls:
    """PEM files of a node's TLS client port (ZooKeeper 3.8 reads PEM directly)."""

    cert: str
    key: str
    ca: str
    #: Whether clients must show a certificate signed by ``ca``.
    need_client_auth: bool = True


def role(port: int) -> str | None:
    """``leader``, ``follower`` or ``standalone`` for the node serving on ``port``; None
    while it does not serve (down, or between leaders)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"srvr")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
    except OSError:
        return None
    for line in reply.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


@dataclass
class Ensemble:
    """Three ZooKeeper nodes; ``hosts`` is kazoo's connection string for all of them."""

    nodes: list[brokers.BrokerProcess]
    workdir: str
    #: The TLS client port of each node (0 without TLS).
    secure_ports: list[int] = field(default_factory=list)
    start_time_s: float = 0.0

    @property
    def hosts(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`` (the plain client ports)."""
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def secure_hosts(self) -> str:
        """The same for the TLS client ports."""
        return ",".join(f"127.0.0.1:{p}" for p in self.secure_ports)

    @property
    def url(self) -> str:
        """``zookeeper://`` with every node."""
        return f"zookeeper://{self.hosts}"

    def roles(self) -> list[str | None]:
        """Each node's role (None for a node that is down or not serving)."""
        return [role(n.port) if n.alive() else None for n in self.nodes]

    def leader(self) -> int | None:
        """Index of the node that is leader now, or None."""
        found = [i for i, r in enumerate(self.roles()) if r == "leader"]
        return found[0] if found else None

    def wait_for_leader(
        self, excluding: int | None = None, timeout_s: float = ELECTION_TIMEOUT_S
    ) -> int:
        """Index of the leader once there is one (not ``excluding``) and a follower serves."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            roles = self.roles()
            leaders = [i for i, r in enumerate(roles) if r == "leader" and i != excluding]
            if leaders and "follower" in roles:
                return leaders[0]
            time.sleep(brokers.PROBE_INTERVAL_S)
        raise AssertionError(f"no ZooKeeper leader within {timeout_s} s: roles {self.roles()}")

    def kill_leader(self) -> tuple[int, float]:
        """SIGKILL the leader's JVM; its index and the (monotonic) time of the kill."""
        index = self.wait_for_leader()
        self.nodes[index].kill()
        return index, time.monotonic()

    def stop(self) -> None:
        """Stop every node and delete every file."""
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _write_conf(
    path: str,
    data_dir: str,
    port: int,
    peers: list[tuple[int, int]],
    secure_port: int,
    tls: NodeTls | None,
) -> None:
    lines = [
        f"tickTime={TICK_MS}",
        f"initLimit={INIT_LIMIT_TICKS}",
        f"syncLimit={SYNC_LIMIT_TICKS}",
        f"maxSessionTimeout={MAX_SESSION_TICKS * TICK_MS}",
        f"dataDir={data_dir}",
        f"clientPort={port}",
        "clientPortAddress=127.0.0.1",
        "admin.enableServer=false",  # no HTTP port to collide on; srvr tells the role
        "4lw.commands.whitelist=srvr,ruok,envi,mntr",  # role; kazoo's server_version()
        "maxClientCnxns=0",  # the fault tests open many sessions
        # Followers report a dead leader fast; the election then takes a second.
        "cnxTimeout=1000",
    ]
    lines += [
        f"server.{i + 1}=127.0.0.1:{peer}:{election}" for i, (peer, election) in enumerate(peers)
    ]
    if tls is not None:
        lines += [
            f"secureClientPort={secure_port}",
            "secureClientPortAddress=127.0.0.1",
            # TLS for clients is Netty's: the NIO factory has none.
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            "ssl.keyStore.type=PEM",
            f"ssl.keyStore.location={tls.cert}",
            "ssl.trustStore.type=PEM",
            f"ssl.trustStore.location={tls.ca}",
            f"ssl.clientAuth={'need' if tls.need_client_auth else 'none'}",
            # The client certificate is checked against the CA, not its address.
            "ssl.hostnameVerification=false",
        ]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def _pem_bundle(directory: str, tls: NodeTls) -> NodeTls:
    """ZooKeeper's PEM key store is one file: the private key, then the certificate."""
    bundle = os.path.join(directory, "server-keystore.pem")
    with open(bundle, "w") as out:
        for part in (tls.key, tls.cert):
            with open(part) as fh:
                out.write(fh.read())
    return NodeTls(bundle, tls.key, tls.ca, tls.need_client_auth)


def _make(base: list[str], tls: NodeTls | None, timeout_s: float) -> Ensemble:
    workdir = tempfile.mkdtemp(prefix="flowengine-zk-ensemble-")
    ports = [brokers.free_port() for _ in range(NODES)]
    peers = [(brokers.free_port(), brokers.free_port()) for _ in range(NODES)]
    secure = [brokers.free_port() if tls else 0 for _ in range(NODES)]
    extra_jars: list[str] = []
    if tls is not None:
        tls = _pem_bundle(workdir, tls)
        extra_jars += NETTY_EXTRA_JARS
    if os.path.isfile(SLF4J_SIMPLE_JAR):
        extra_jars.append(SLF4J_SIMPLE_JAR)
        base = [base[0], *SLF4J_SIMPLE_PROPERTIES, *base[1:]]
    if extra_jars:
        base = [*base[:-1], base[-1] + ":" + ":".join(extra_jars)]
    nodes = []
    for i in range(NODES):
        wd = os.path.join(workdir, f"node{i + 1}")
        data = os.path.join(wd, "data")
        os.makedirs(data)
        with open(os.path.join(data, "myid"), "w") as fh:
            fh.write(f"{i + 1}\n")
        conf = os.path.join(wd, "zoo.cfg")
        _write_conf(conf, data, ports[i], peers, secure[i], tls)
        log = os.path.join(wd, "zookeeper.log")
        cmd = [*base, "org.apache.zookeeper.server.quorum.QuorumPeerMain", conf]
        port = ports[i]

        def ready(p: int = port) -> bool:  # serving: a quorum has a leader
            return role(p) in ("leader", "follower")

        node = brokers.BrokerProcess(
            f"zookeeper-{i + 1}",
            f"zookeeper://127.0.0.1:{port}",
            port,
            wd,
            log,
            owns_workdir=False,
            launches=[brokers._Launch(cmd, log, None, ready, timeout_s)],
        )
        nodes.append(node)
    return Ensemble(nodes, workdir, secure)


def _start_all(ensemble: Ensemble) -> None:
    errors: list[str] = []

    def start(node: brokers.BrokerProcess) -> None:
        try:
            node.start()
        except brokers.BrokerUnavailable as e:
            errors.append(str(e))

    threads = [threading.Thread(target=start, args=(n,)) for n in ensemble.nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise brokers.BrokerUnavailable("\n---\n".join(errors))


def start(tls: NodeTls | None = None, timeout_s: float = ENSEMBLE_START_TIMEOUT_S) -> Ensemble:
    """Start three nodes on free loopback ports, all at once; raise BrokerUnavailable.

    With ``tls``, each node also serves TLS clients on ``secure_ports``.
    Retried with fresh ports when a node does not come up (a port chosen free
    may be taken before the JVM binds it).
    """
    base = brokers.zookeeper_command()
    if base is None:
        raise brokers.BrokerUnavailable(
            "ZooKeeper not found (apt-get install zookeeper: it"
            " needs java and /usr/share/java/zookeeper.jar)"
        )
    if tls is not None:
        missing = [jar for jar in NETTY_EXTRA_JARS if not os.path.isfile(jar)]
        if missing:
            raise brokers.BrokerUnavailable(
                f"ZooKeeper TLS needs Netty: {missing} not found (apt-get install libnetty-java)"
            )
    errors = []
    for _ in range(brokers.START_ATTEMPTS):
        began = time.monotonic()
        ensemble = _make(base, tls, timeout_s)
        try:
            _start_all(ensemble)
        except brokers.BrokerUnavailable as e:
            errors.append(str(e))
            ensemble.stop()
            continue
        ensemble.start_time_s = time.monotonic() - began
        return ensemble
    raise brokers.BrokerUnavailable("\n===\n".join(errors))


if __name__ == "__main__":  # manual check: start, show roles, kill the leader, stop
    e = start()
    print(f"up in {e.start_time_s:.1f} s: {e.hosts} roles {e.roles()}")
    killed, at = e.kill_leader()
    new = e.wait_for_leader(excluding=killed)
    print(
        f"killed node {killed + 1}; node {new + 1} leads after"
        f" {time.monotonic() - at:.2f} s; roles {e.roles()}"
    )
    e.stop()
