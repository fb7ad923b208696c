"""Writes through Sentinel count as done once the replica has them (redis_replicas.py).

Given a channel of the Sentinel transport, a publication returns only once
the replica holds it; with the replica frozen (SIGSTOP), it waits for the
bound, says that the write stands on the master alone, and later writes stop
waiting for a while (a cluster without replicas pays one wait per pause).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid

import pytest

from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import redis_consumers as rc
from flowengine.utils import redis_replicas
from tests.clusters.redis.conftest import sentinel_url

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("redis_sentinel")]

#: This test's bound on a wait for the replica (s): its own, so that the
#: pause it causes is not shared with other tests of the process.
TIMEOUT_S = 0.3
PUBLICATIONS = 50


def _replica(cluster):
    master = cluster.master_port()
    return next(s for s in cluster.servers() if s.port != master)


def test_a_publication_returns_once_the_replica_has_it(cluster, caplog):
    # Given a channel through the Sentinels, waiting for 1 replica (the default)
    broker = BrokerSettings(
        sentinel_url(cluster),
        transport_options={
            "master_name": cluster.service,
            redis_replicas.TIMEOUT_OPTION: TIMEOUT_S,
        },
    )
    queue = f"q-{uuid.uuid4().hex[:8]}"
    replica = _replica(cluster)
    with (
        contextlib.closing(broker.connection()) as conn,
        contextlib.closing(cluster.client(replica.port)) as on_replica,
    ):
        channel = conn.default_channel
        with channel.conn_or_acquire() as client:
            publishing = channel.replicated(client)
            # When messages are published, Then each is on the replica when it returns
            for n in range(1, PUBLICATIONS + 1):
                rc.publish(publishing, [rc.Push("", queue, f"m{n}")])
                assert on_replica.llen(queue) == n
            # When the replica is frozen
            os.kill(replica.procs[-1].pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with caplog.at_level(logging.WARNING):
                    rc.publish(publishing, [rc.Push("", queue, "alone")])
                waited = time.monotonic() - started
                started = time.monotonic()
                rc.publish(publishing, [rc.Push("", queue, "after")])
                after = time.monotonic() - started
            finally:
                os.kill(replica.procs[-1].pid, signal.SIGCONT)
            client.delete(queue)
    # Then the publication waited for the bound and said so; the next did not wait
    assert waited >= TIMEOUT_S, waited
    assert any("stands on the master alone" in r.getMessage() for r in caplog.records)
    assert after < TIMEOUT_S, after
