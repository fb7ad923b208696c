"""Fixtures of the Redis cluster fault tests: one Sentinel cluster per module, restored.

A module's tests share one primary + replica + three Sentinels
(``tests/redis_sentinel.py``, ~2 s to start). A test that kills the master
calls :func:`restore` afterwards: the killed server comes back on its port
and Sentinel makes it a replica of the new master, so the next test again
has a master with a replica in sync. The tests are marked
``xdist_group("redis_sentinel")``: under ``-n 2 --dist loadgroup`` they run
in one process, one after the other, never two failovers at once.
"""

from __future__ import annotations

import contextlib
import os
import time

import brokers
import pytest
import redis
import redis_sentinel

from tests.reliability.harness import Conn

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

#: Bound (s) on a restarted server becoming a replica in sync again.
RESTORE_WAIT_S = 60.0
POLL_S = 0.05


def _started(starter):
    try:
        return starter()
    except brokers.BrokerUnavailable as e:
        if IN_CI:
            pytest.fail(f"CI=true and {e}", pytrace=False)
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cluster():
    """A Redis primary, a replica and three Sentinels shared by the module's tests."""
    started = _started(redis_sentinel.start_cluster)
    yield started
    started.stop()


def sentinel_url(cluster: redis_sentinel.SentinelCluster, query: str = "") -> str:
    """kombu's spelling: ``sentinel://h1:p1;sentinel://h2:p2;...`` (``query`` on the first)."""
    first, *rest = [f"sentinel://127.0.0.1:{port}" for port in cluster.sentinel_ports]
    return ";".join([f"{first}/0{query}", *rest])


def transport_conn(cluster: redis_sentinel.SentinelCluster, query: str = "", **options) -> Conn:
    """How workers and engines reach the cluster's master through its Sentinels."""
    return Conn(
        "sentinel",
        url=sentinel_url(cluster, query),
        transport_options={"master_name": cluster.service, **options},
    )


def restore(cluster: redis_sentinel.SentinelCluster, killed: brokers.BrokerProcess) -> None:
    """Start the killed server again and wait until it is the new master's replica, in sync."""
    killed.start()
    # The Sentinels would make it a replica too, after their next looks at it
    # (~10 s); told at once, it syncs in well under a second.
    master = cluster.master_port()
    with contextlib.closing(cluster.client(killed.port)) as c:
        c.replicaof("127.0.0.1", master)
    deadline = time.monotonic() + RESTORE_WAIT_S

    def in_sync() -> bool:
        try:
            with contextlib.closing(cluster.client(killed.port)) as c:
                info = c.info("replication")
        except redis.RedisError:
            return False
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    while not in_sync():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the killed server did not come back as a replica within"
                f" {RESTORE_WAIT_S} s:\n{killed.log_tail()}"
            )
        time.sleep(POLL_S)
