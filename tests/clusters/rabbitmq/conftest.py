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
