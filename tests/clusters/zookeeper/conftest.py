"""Fixtures of the ZooKeeper ensemble tests: one 3-node ensemble per test session.

``zk_ensemble`` (session): three ZooKeeper nodes on loopback
(``tests/zookeeper_ensemble.py``), each serving plain clients on its client
port and TLS clients (certificates required) on its ``secureClientPort``,
with throwaway certificates made by openssl (``tests/redis_tls.py``).
``ensemble`` (function): the same ensemble, whole again after the test (a
node the test killed is started again, on its port and data). Every test
using them is marked ``xdist_group("zookeeper_ensemble")`` so that one
pytest process runs them all, on one ensemble.
"""

from __future__ import annotations

import os
import sys

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _path in (_TESTS, os.path.dirname(_TESTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import brokers  # noqa: E402
import redis_tls  # noqa: E402
import zookeeper_ensemble  # noqa: E402

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


class ZkCluster:
    """The ensemble and the certificates its TLS ports use."""

    def __init__(
        self, ensemble: zookeeper_ensemble.Ensemble, certs: redis_tls.Certificates
    ) -> None:
        self.ensemble = ensemble
        self.certs = certs

    def tls_conf(self, **overrides: object) -> dict:
        """TaskFlow's kazoo keys (plus flowengine's ``ca``) for the TLS ports."""
        return {
            "hosts": self.ensemble.secure_hosts,
            "use_ssl": "true",
            "verify_certs": "true",
            "ca": self.certs.ca,
            "certfile": self.certs.client_cert,
            "keyfile": self.certs.client_key,
            **overrides,
        }


@pytest.fixture(scope="session")
def zk_ensemble(tmp_path_factory) -> ZkCluster:
    """Three ZooKeeper nodes (plain and TLS client ports) for this pytest process."""
    certs = redis_tls.make_certificates(tmp_path_factory.mktemp("zk-certs"))
    try:
        ensemble = zookeeper_ensemble.start(
            zookeeper_ensemble.NodeTls(
                certs.server_cert, certs.server_key, certs.ca, need_client_auth=True
            )
        )
    except brokers.BrokerUnavailable as e:
        reason = f"ZooKeeper ensemble unavailable: {e}"
    else:
        sys.stderr.write(
            f"\n[zookeeper ensemble] {ensemble.hosts} up in {ensemble.start_time_s:.2f} s\n"
        )
        yield ZkCluster(ensemble, certs)
        ensemble.stop()
        return
    if IN_CI:  # a broken install must fail CI, never skip it green
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


#: How much of each node's log a failed test report shows.
NODE_LOG_TAIL_CHARS = 6000


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _log_since(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return "(no log)"


class NodeLogs:
    """What each node of the ensemble logged during one test."""

    def __init__(self, cluster: ZkCluster) -> None:
        self.paths = [n.log_path for n in cluster.ensemble.nodes]
        self.offsets = [_log_size(p) for p in self.paths]

    def texts(self) -> list[str]:
        """Each node's lines since the test began (a restarted node appends to its file)."""
        return [_log_since(p, o) for p, o in zip(self.paths, self.offsets)]

    def save(self, directory: str) -> None:
        """Write them as ``zookeeper-node<N>.log`` in ``directory`` (the test's tmp dir)."""
        for i, text in enumerate(self.texts()):
            with open(os.path.join(directory, f"zookeeper-node{i + 1}.log"), "w") as fh:
                fh.write(text)

    def tails(self) -> str:
        """The end of each node's lines, for a failed test's report."""
        return "\n".join(
            f"--- zookeeper node {i + 1} (last {NODE_LOG_TAIL_CHARS} chars) ---\n"
            + text[-NODE_LOG_TAIL_CHARS:]
            for i, text in enumerate(self.texts())
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A failed ensemble test shows what the nodes logged: the ensemble (and
    # its files) outlive the test, and the cause is often only in there.
    outcome = yield
    report = outcome.get_result()
    logs = getattr(item, "zookeeper_node_logs", None)
    if logs is not None and report.when == "call" and report.failed:
        report.sections.append(("zookeeper nodes", logs.tails()))


@pytest.fixture
def ensemble(zk_ensemble: ZkCluster, request, tmp_path) -> ZkCluster:
    """The session's ensemble; a node killed by the test is started again afterwards.

    Each node's log lines of the test are kept as ``zookeeper-node<N>.log``
    in the test's ``tmp_path`` (and their tails shown when it fails).
    """
    logs = NodeLogs(zk_ensemble)
    request.node.zookeeper_node_logs = logs
    yield zk_ensemble
    logs.save(str(tmp_path))
    for node in zk_ensemble.ensemble.nodes:
        if not node.alive():
            node.kill()  # forget the dead process, keep its port and data
            node.start()
    zk_ensemble.ensemble.wait_for_leader()
