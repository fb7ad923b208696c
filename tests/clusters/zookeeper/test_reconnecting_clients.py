"""ZooKeeper boards and persistence whose client is between two nodes of the ensemble.

A way a node's death used to stall a user of its client for ever (made
certain here, where a loaded machine only hits it now and then):

* A connection asked for while the client reconnects: kazoo's ``start()``
  on a running client joins its busy connection thread without a bound.
  A conductor claiming a job in that second hung, its job never run (the
  leader-loss fault test's stall).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from flowengine import exceptions as exc
from flowengine.jobs import backends
from flowengine.jobs.backends import zk_store
from flowengine.persistence.backends import impl_zookeeper
from flowengine.utils import kazoo_utils
from tests.clusters.zookeeper.test_leader_loss import LEASE_S, WAIT_S

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("zookeeper_ensemble")]

#: The bound on waiting for a session, shortened: the client cannot get one.
SHORT_CONNECT_S = 2.0
#: How long the test waits for those calls to end (a hung one never does).
ASKED_JOIN_S = SHORT_CONNECT_S + 20.0


def _board(name: str, client, namespace: str):
    conf = {
        "board": "zookeeper",
        "path": "/flowengine-test/jobs",
        "namespace": namespace,
        "lease_s": LEASE_S,
    }
    return backends.fetch(name, conf, client=client)


def test_a_connection_asked_for_while_the_client_reconnects_fails_in_bound_not_hangs(
    ensemble, monkeypatch
):
    # Given a persistence backend and a board sharing a client whose only
    # node is the leader, with a short bound on waiting for a session
    monkeypatch.setattr(impl_zookeeper, "CONNECT_TIMEOUT_S", SHORT_CONNECT_S)
    monkeypatch.setattr(zk_store, "CONNECT_TIMEOUT_S", SHORT_CONNECT_S)
    e = ensemble.ensemble
    leader = e.wait_for_leader()
    client = kazoo_utils.make_client(
        {"hosts": f"127.0.0.1:{e.nodes[leader].port}", "timeout": LEASE_S}
    )
    namespace = f"t{uuid.uuid4().hex[:10]}"
    persistence = impl_zookeeper.ZkBackend({"path": f"/flowengine-test/{namespace}"}, client=client)
    board = _board("between-nodes", client, namespace)
    failures: dict[str, BaseException] = {}
    try:
        persistence.get_connection().close()
        board.connect()
        suspended = threading.Event()
        client.add_listener(lambda state: suspended.set() if state == "SUSPENDED" else None)
        # When its node is killed -9 (the client keeps trying to reconnect)
        # and a connection to each is asked for meanwhile
        e.nodes[leader].kill()
        assert suspended.wait(WAIT_S), "the client did not notice its node's death"

        def ask(what: str, call) -> None:
            try:
                call()
            except BaseException as err:  # noqa: BLE001 - reported by the test thread
                failures[what] = err

        asked = [
            threading.Thread(target=ask, args=("persistence", persistence.get_connection)),
            threading.Thread(target=ask, args=("board", board.connect)),
        ]
        started = time.monotonic()
        for thread in asked:
            thread.daemon = True  # a hung one must not hold the test process
            thread.start()
        for thread in asked:
            thread.join(max(0.0, started + ASKED_JOIN_S - time.monotonic()))
        # Then each fails, at the bound, naming the cause (it used to hang for ever
        # in kazoo's start(), the caller's thread and lock held)
        assert not any(t.is_alive() for t in asked), (
            f"still blocked {time.monotonic() - started:.0f} s after asking for a connection"
            " while the client reconnects"
        )
        assert isinstance(failures.get("persistence"), exc.StorageFailure), failures
        assert isinstance(failures.get("board"), exc.BoardUnavailable), failures
        assert "no session within" in str(failures["persistence"])
        # And the client still runs: it is connecting, not stopped by the call
        assert client.client_state != "CLOSED"
    finally:
        board.close()
        persistence.close()
        kazoo_utils.finalize_client(client)
