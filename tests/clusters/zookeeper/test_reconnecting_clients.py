"""ZooKeeper boards and persistence whose client is between two nodes of the ensemble.

Two ways a node's death used to stall a user of its client for ever (each
made certain here, where a loaded machine only hits it now and then):

* A connection asked for while the client reconnects: kazoo's ``start()``
  on a running client joins its busy connection thread without a bound.
  A conductor claiming a job in that second hung, its job never run (the
  leader-loss fault test's stall).
* A board's watches: kazoo re-sends no watch to the node it reconnects to,
  and its ``ChildrenWatch`` believed its watch armed when a re-listing was
  answered just before the drop; it never fired again, so a board waiting
  for an outcome waited for ever.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from flowengine import exceptions as exc
from flowengine.jobs import backends
from flowengine.jobs import base as jobs_base
from flowengine.jobs.backends import zk_store
from flowengine.persistence.backends import impl_zookeeper
from flowengine.utils import kazoo_utils
from tests.clusters.zookeeper.test_leader_loss import LEASE_S, WAIT_S, leader_first

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("zookeeper_ensemble")]

#: Bound on seeing an event once reconnected (it takes milliseconds): only
#: a lost watch reaches it.
EVENT_WAIT_S = 30.0


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


def test_a_board_still_sees_new_jobs_after_a_listing_answered_just_before_its_node_died(ensemble):
    # Given a board on a client connected to the leader, and, on another
    # client (on the other nodes: it is not interrupted), a second board that posts
    e = ensemble.ensemble
    namespace = f"t{uuid.uuid4().hex[:10]}"
    hosts = leader_first(e)
    client = kazoo_utils.make_client({"hosts": hosts, "timeout": LEASE_S})
    watcher = _board("watcher", client, namespace)
    others = ",".join(hosts.split(",")[1:])
    poster_client = kazoo_utils.make_client({"hosts": others, "timeout": LEASE_S})
    poster = _board("poster", poster_client, namespace)
    posted: list[str] = []
    seen_posted = threading.Condition()

    def on_posted(_event: str, details: dict) -> None:
        with seen_posted:
            posted.append(details["job_uuid"])
            seen_posted.notify_all()

    try:
        watcher.connect()
        poster.connect()
        watcher.notifier.register(jobs_base.POSTED, on_posted)
        leader = e.leader()
        assert client._connection._socket.getpeername()[1] == e.nodes[leader].port
        suspended, reconnected = threading.Event(), threading.Event()

        def on_state(state: str) -> None:
            if state == "SUSPENDED":
                suspended.set()
            elif state == "CONNECTED" and suspended.is_set():
                reconnected.set()

        client.add_listener(on_state)
        # And the watcher's next listing of its jobs folder is handed back
        # only once its node was killed -9 and its client saw the drop (what
        # a loaded machine does now and then, made certain here)
        listed = f"{watcher._store.path}/listed"
        real_get_children_async = client.get_children_async
        hold = threading.Event()
        hold.set()

        def answered_then_dropped(path, *args, **kwargs):
            pending = real_get_children_async(path, *args, **kwargs)
            if path != listed or not hold.is_set():
                return pending
            hold.clear()
            children = pending.get(timeout=WAIT_S)  # answered, its watch registered
            e.nodes[leader].kill()
            assert suspended.wait(WAIT_S), "the client did not notice its node's death"
            handed_back = client.handler.async_result()
            handed_back.set(children)
            return handed_back

        client.get_children_async = answered_then_dropped
        # When a job posted fires the watcher's watch, whose re-listing is
        # answered over the drop
        poster.post("before-the-drop", None)
        assert reconnected.wait(WAIT_S), "the client did not reconnect to a surviving node"
        assert not hold.is_set(), "the watcher never re-listed its jobs folder"
        # Then the watcher sees a job posted after its client reconnected
        after = poster.post("after-the-drop", None)
        with seen_posted:
            assert seen_posted.wait_for(lambda: after.uuid in posted, EVENT_WAIT_S), (
                f"the watcher's board saw no POSTED event for {after.uuid} after reconnecting"
                f" (events seen: {posted}; kazoo child watches:"
                f" {sorted(client._child_watchers)})"
            )
    finally:
        watcher.close()
        poster.close()
        kazoo_utils.finalize_client(client)
        kazoo_utils.finalize_client(poster_client)
