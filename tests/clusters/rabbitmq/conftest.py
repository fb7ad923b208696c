"""One throwaway 3-node RabbitMQ cluster per test module (``tests/rabbitmq_cluster.py``),
and a TLS-only RabbitMQ with throwaway certificates (``tests/rabbitmq_tls.py``).

The cluster tests are marked ``xdist_group("rabbitmq_cluster")`` so that under
``-n 2 --dist loadgroup`` they run in one process, one after the other: the
cluster (three Erlang VMs) is started once, never twice at once. The TLS
tests are a group of their own (``rabbitmq_tls``): one group spanning two
modules may be run interleaved, and each module would then start its broker
again for every switch.
"""

from __future__ import annotations

import os

import brokers
import pytest
import rabbitmq_cluster
import rabbitmq_tls
import redis_tls

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    # As tests/conftest.py: a skip with the reason locally, a failure in CI.
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give this folder's ``xdist_group`` tests their group suffix where xdist could not.

    pytest-xdist 3.8 marks a grouped test by setting ``item._nodeid`` (its
    id plus ``@group``); pytest 9 keeps the id in ``item._id`` and no longer
    reads ``_nodeid``, so ``--dist loadgroup`` sent the tests of one group to
    both workers, and each started a cluster. Here (only for the tests of
    this folder, in an xdist worker with loadgroup) the suffix is put where
    pytest reads it. Harmless where xdist already did it.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is None or "@" in item.nodeid or not str(item.path).startswith(here):
            continue
        if not hasattr(item, "_id"):
            continue
        item._id = NodeId.parse(f"{item.nodeid}@{mark.args[0]}")


@pytest.fixture(scope="module")
def rabbit_cluster():
    """Three rabbitmq-server nodes joined in one cluster; stopped after the module."""
    try:
        cluster = rabbitmq_cluster.start_cluster()
    except brokers.BrokerUnavailable as e:
        _unavailable(f"3-node RabbitMQ cluster unavailable: {str(e)[:2000]}")
    print(f"\n[rabbitmq cluster] 3 nodes up and joined in {cluster.start_time_s:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def tls_rabbitmq(tmp_path_factory):
    """A TLS-only rabbitmq-server requiring client certificates, and its certificates."""
    certs = redis_tls.make_certificates(tmp_path_factory.mktemp("rabbitmq-certs"))
    try:
        server = rabbitmq_tls.start_tls_rabbitmq(certs)
    except brokers.BrokerUnavailable as e:
        _unavailable(f"TLS rabbitmq-server unavailable: {str(e)[:2000]}")
    try:
        yield server, certs
    finally:
        server.stop()
