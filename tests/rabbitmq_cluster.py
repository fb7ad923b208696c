"""A throwaway 3-node RabbitMQ cluster on loopback, for failover and quorum-queue tests.

::

    cluster = rabbitmq_cluster.start_cluster()
    url = cluster.failover_url          # "amqp://...:P1//;amqp://...:P2//;amqp://...:P3//"
    leader = cluster.queue_leader("q")  # index of the node leading quorum queue q
    cluster.kill(leader)                # kill -9 that node
    cluster.stop()

Each node is a ``rabbitmq-server`` of its own (``tests/brokers.py``'s
environment: own node name, AMQP port, distribution port, data and log
folders), all with one Erlang cookie and one private ``epmd`` (nodes find
each other's distribution ports through it). The three boot in parallel as
standalone nodes; the second and third then join the first with
``rabbitmqctl stop_app / join_cluster / start_app``, as an operator does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import brokers

#: Nodes in the cluster: the smallest that keeps a quorum (2) after losing one.
NODES = 3
#: Bound on one rabbitmqctl call (an Erlang VM boot plus the call itself);
#: generous for a loaded 2-core machine, short enough that a hung node fails.
CTL_TIMEOUT_S = 60.0
#: Bound on a node's boot as a standalone node (see brokers.RABBITMQ_START_TIMEOUT_S).
NODE_START_TIMEOUT_S = brokers.RABBITMQ_START_TIMEOUT_S
#: Erlang VM flags for the test nodes: no busy-waiting schedulers (they would
#: burn the CPU the other nodes and the tests need on a 2-core machine).
QUIET_SCHEDULERS = "+sbwt none +sbwtdcpu none +sbwtdio none"
#: Between two looks at the cluster's state (a queue's leader, a node's status).
POLL_S = 0.1


@dataclass
class Node:
    """One node: its AMQP port, name, environment and process."""

    index: int
    port: int
    name: str
    env: dict[str, str]
    process: brokers.BrokerProcess

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def alive(self) -> bool:
        return self.process.alive()


class RabbitCluster:
    """Three RabbitMQ nodes joined in one cluster; kill -9 any of them."""

    def __init__(
        self, workdir: str, epmd: brokers.BrokerProcess, nodes: list[Node], ctl_port: int
    ) -> None:
        self.workdir = workdir
        self.epmd = epmd
        self.nodes = nodes
        # rabbitmqctl's own distribution port, chosen with the nodes' ports
        # (never one of theirs: stop_app frees a node's AMQP port for a while).
        self._ctl_port = str(ctl_port)
        #: Seconds from the first boot to a formed cluster.
        self.start_time_s = 0.0

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def failover_url(self) -> str:
        """kombu's failover list: every node's URL, ';'-separated."""
        return ";".join(self.urls)

    def ctl(self, via: int, *args: str, timeout_s: float = CTL_TIMEOUT_S) -> str:
        """Run ``rabbitmqctl args`` against node ``via``; its output (raises on failure)."""
        node = self.nodes[via]
        # The CLI's own distribution port: ours (the default range is shared
        # with any other rabbitmqctl on the machine).
        env = dict(
            node.env,
            RABBITMQ_CTL_DIST_PORT_MIN=self._ctl_port,
            RABBITMQ_CTL_DIST_PORT_MAX=self._ctl_port,
        )
        result = subprocess.run(
            [_ctl_binary(), "-n", node.name, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=node.process.workdir,
        )
        if result.returncode != 0:
            raise brokers.BrokerUnavailable(
                f"rabbitmqctl {' '.join(args)} on {node.name} failed ({result.returncode}):"
                f" {result.stdout}{result.stderr}"
            )
        return result.stdout

    def alive_nodes(self) -> list[int]:
        return [node.index for node in self.nodes if node.alive()]

    def queue_leader(self, queue: str) -> int | None:
        """Index of the node leading quorum queue ``queue`` (None: no such queue yet)."""
        via = self.alive_nodes()[0]
        out = self.ctl(via, "list_queues", "--quiet", "--no-table-headers", "name", "leader")
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == queue:
                return next((n.index for n in self.nodes if n.name == parts[1]), None)
        return None

    def queue_type(self, queue: str) -> str | None:
        """``quorum`` or ``classic`` for ``queue`` (None: no such queue)."""
        via = self.alive_nodes()[0]
        out = self.ctl(via, "list_queues", "--quiet", "--no-table-headers", "name", "type")
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == queue:
                return parts[1]
        return None

    def kill(self, index: int) -> float:
        """kill -9 node ``index`` (its whole process group); the monotonic time it died."""
        self.nodes[index].process.kill()
        return time.monotonic()

    def stop(self) -> None:
        """Stop every node, then epmd, and remove every file."""
        with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
            list(pool.map(lambda n: n.process.stop(), self.nodes))
        self.epmd.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tails(self) -> str:
        return "\n".join(f"--- {n.name}\n{n.process.log_tail(1500)}" for n in self.nodes)


def _ctl_binary() -> str:
    script = brokers.rabbitmq_binary()
    assert script is not None
    return os.path.join(os.path.dirname(script), "rabbitmqctl")


def _epmd_binary() -> str:
    return shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different loopback TCP ports, free a moment ago (brokers.free_port's range)."""
    ports: list[int] = []
    while len(ports) < count:
        port = brokers.free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _make_node(
    index: int, base: str, epmd_port: int, cookie: str, port: int, dist_port: int
) -> Node:
    wd = os.path.join(base, f"node{index}")
    os.makedirs(wd)
    env = brokers._rabbitmq_env(wd, port, dist_port, epmd_port)
    env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] += f" {QUIET_SCHEDULERS}"
    # One cookie for all: the nodes (and rabbitmqctl, whose HOME is the
    # node's folder) may talk to each other.
    cookie_path = os.path.join(wd, ".erlang.cookie")
    with open(cookie_path, "w") as fh:
        fh.write(cookie)
    os.chmod(cookie_path, 0o400)
    log = os.path.join(wd, "rabbitmq.out")
    script = brokers.rabbitmq_binary()
    assert script is not None
    launch = brokers._Launch(
        [script], log, env, lambda: brokers._amqp_login(port), NODE_START_TIMEOUT_S
    )
    process = brokers.BrokerProcess(
        f"rabbitmq-node{index}",
        f"amqp://127.0.0.1:{port}",
        port,
        wd,
        log,
        launches=[launch],
        owns_workdir=False,
    )
    return Node(index, port, env["RABBITMQ_NODENAME"], env, process)


def start_cluster() -> RabbitCluster:
    """Start three nodes in parallel and join them into one cluster; raise BrokerUnavailable.

    Retried with fresh ports (brokers.START_ATTEMPTS times in all): a port
    chosen free can be taken by another process before a node binds it.
    """
    if brokers.rabbitmq_binary() is None or not os.access(_epmd_binary(), os.X_OK):
        raise brokers.BrokerUnavailable(
            "rabbitmq-server (or Erlang's epmd) not found (apt-get install rabbitmq-server)"
        )
    errors = []
    for _ in range(brokers.START_ATTEMPTS):
        try:
            return _start_cluster_once()
        except brokers.BrokerUnavailable as e:
            errors.append(str(e))
    raise brokers.BrokerUnavailable("\n---\n".join(errors))


def _start_cluster_once() -> RabbitCluster:
    started = time.monotonic()
    base = tempfile.mkdtemp(prefix="flowengine-rabbitmq-cluster-")
    # epmd, rabbitmqctl, and an AMQP and a distribution port per node.
    epmd_port, ctl_port, *node_ports = distinct_free_ports(2 + 2 * NODES)
    epmd = brokers.BrokerProcess(
        "epmd",
        "",
        epmd_port,
        base,
        os.path.join(base, "epmd.log"),
        launches=[
            brokers._Launch(
                [_epmd_binary(), "-port", str(epmd_port), "-address", "127.0.0.1"],
                os.path.join(base, "epmd.log"),
                None,
                lambda: brokers.tcp_open(epmd_port),
                brokers.EPMD_START_TIMEOUT_S,
            )
        ],
        owns_workdir=False,
    )
    cookie = uuid.uuid4().hex
    nodes: list[Node] = []
    cluster = RabbitCluster(base, epmd, nodes, ctl_port)
    try:
        epmd.start()
        nodes.extend(
            _make_node(i, base, epmd_port, cookie, node_ports[2 * i], node_ports[2 * i + 1])
            for i in range(NODES)
        )
        with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
            for future in [pool.submit(node.process.start) for node in nodes]:
                future.result()
        for node in nodes[1:]:
            # One at a time: two nodes joining at once race on the schema.
            _join(cluster, node.index, nodes[0].name)
        cluster.start_time_s = time.monotonic() - started
        return cluster
    except BaseException:
        cluster.stop()
        raise


def _join(cluster: RabbitCluster, index: int, first: str) -> None:
    cluster.ctl(index, "stop_app")
    cluster.ctl(index, "join_cluster", first)
    cluster.ctl(index, "start_app")
    port = cluster.nodes[index].port
    if not brokers._wait_until(
        lambda: brokers._amqp_login(port), cluster.nodes[index].alive, NODE_START_TIMEOUT_S
    ):
        raise brokers.BrokerUnavailable(
            f"node {index} did not serve again after joining:\n"
            + cluster.nodes[index].process.log_tail()
        )


@contextlib.contextmanager
def running_cluster() -> Iterator[RabbitCluster]:
    """Context manager: a throwaway 3-node cluster for the duration of the block."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()
