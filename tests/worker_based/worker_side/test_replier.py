"""Replier: what a worker says to executors, on a real proxy (memory transport).

The heartbeat thread is also run on every broker. Each memory test ends
with a marker reply: replies from one publisher reach the
client in the order they were sent, so once the marker arrived everything
sent before it has too, and nothing unexpected can still be on its way.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from wire_helpers import WAIT_S, Client, as_broker, conn_kwargs

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging.proxy import Proxy
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.worker_side import held
from flowengine.engines.worker_based.worker_side.middleware import MiddlewareChain
from flowengine.engines.worker_based.worker_side.replier import Identity, Replier

TOPIC = "t"
KEY = ("u-1", pr.EXECUTE, "sub-1")
INTERVAL_S = 0.5


@contextlib.contextmanager
def replier_and_client(
    announce_period_s: float = pr.NOTIFY_PERIOD_S, interval_s: float = INTERVAL_S, **conn: Any
) -> Iterator[tuple[Replier, held.RequestMemory, Client]]:
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    conn = conn or {"transport": "memory"}
    broker = as_broker(conn)["broker"]
    identity = Identity("w-1", "host:1", TOPIC, ("tasks.A", "tasks.B"))
    memory = held.RequestMemory()
    proxy = Proxy(TOPIC, exchange, broker=broker)
    replier = Replier(
        proxy, memory, identity, interval_s, MiddlewareChain(), announce_period_s=announce_period_s
    )
    # Consuming, as a server's proxy is: the replier announces only then.
    loop = threading.Thread(target=proxy.start, daemon=True)
    with Client(exchange, **conn) as client:
        loop.start()
        assert proxy.wait(WAIT_S), "the replier's proxy did not start consuming"
        try:
            yield replier, memory, client
        finally:
            replier.stop()
            proxy.stop()
            loop.join(WAIT_S)
            for entry in memory.held():
                memory.forget(entry.key)


def _sent_before_marker(replier: Replier, client: Client, cid: str) -> list[str]:
    """States sent to ``client`` for ``cid``, once everything sent so far has arrived."""
    marker = f"marker-{uuid.uuid4().hex}"
    assert replier.reply(client.uuid, marker, pr.SUCCESS, result=None)
    assert client.wait_for(lambda: client.states(marker) != [])
    return client.states(cid)


def _hold(memory: held.RequestMemory, client: Client, attempt: int | None = 0) -> held.Held:
    verdict = memory.admit(KEY, client.uuid, attempt, announced=attempt is not None)
    assert verdict.held is not None
    return verdict.held


def test_replies_name_the_worker_its_heartbeat_and_the_attempt():
    with replier_and_client() as (replier, _memory, client):
        assert replier.reply(client.uuid, "u-1", pr.RUNNING, 3)
        assert client.wait_for(lambda: client.states("u-1") == [pr.RUNNING])
        _data, headers = client.responses["u-1"][0]
        assert headers[pr.HEADER_WORKER_ID] == "w-1" and headers[pr.HEADER_ORIGIN] == "host:1"
        assert headers[lv.HEADER_HEARTBEAT] == INTERVAL_S and headers[pr.HEADER_ATTEMPT] == 3


def test_heartbeats_stop_once_a_request_is_answered():
    with replier_and_client() as (replier, memory, client):
        # Given a request held for a flowengine executor: queued, then running
        entry = _hold(memory, client)
        assert replier.send_heartbeats() == 1
        memory.start(KEY)
        assert replier.send_heartbeats() == 1
        # When its outcome is about to be sent
        replier.answering(entry, {"state": pr.SUCCESS, "data": {"result": 1}})
        # Then no heartbeat follows it
        assert replier.send_heartbeats() == 0
        assert _sent_before_marker(replier, client, "u-1") == [pr.PENDING, pr.RUNNING]


def test_a_taskflow_executor_hears_no_pending_heartbeat():
    with replier_and_client() as (replier, memory, client):
        _hold(memory, client, attempt=None)  # TaskFlow sends no attempt
        assert replier.send_heartbeats() == 0
        memory.start(KEY)
        assert replier.send_heartbeats() == 1
        assert _sent_before_marker(replier, client, "u-1") == [pr.RUNNING]


def test_a_taskflow_executor_hears_running_as_its_request_starts():
    with replier_and_client() as (replier, memory, client):
        entry = _hold(memory, client, attempt=None)
        memory.start(KEY)
        # No heartbeat thread runs: RUNNING goes out from the caller, at once
        assert replier.started(entry)
        assert _sent_before_marker(replier, client, "u-1") == [pr.RUNNING]


def test_a_flowengine_executor_hears_running_only_from_a_request_still_running():
    second_key = ("u-2", pr.EXECUTE, "sub-2")
    with replier_and_client() as (replier, memory, client):
        # Given a short request: started, then answered (the heartbeat thread,
        # which would tell RUNNING, is not running yet: no race with it)
        short = _hold(memory, client)
        memory.start(KEY)
        assert replier.started(short)
        replier.answering(short, {"state": pr.SUCCESS, "data": {"result": 1}})
        # And a long one started after it, still running
        long_ = memory.admit(second_key, client.uuid, 0, announced=True).held
        assert long_ is not None and memory.start(second_key) is long_
        assert replier.started(long_)
        # When the heartbeat thread runs and the long one's RUNNING arrives
        # (the short one's was due first)
        replier.start()
        assert client.wait_for(lambda: pr.RUNNING in client.states("u-2"))
        # Then the short one was never said to be RUNNING: its outcome says it all
        assert _sent_before_marker(replier, client, "u-1") == []
        memory.forget(second_key)


def test_an_outcome_says_how_long_its_body_ran():
    with replier_and_client() as (replier, memory, client):
        entry = _hold(memory, client)
        memory.start(KEY)
        work = pr.WorkUnit("tasks.A", "a", pr.EXECUTE, {})
        assert replier.send_outcome(entry, work, pr.SUCCESS, 7, run_s=0.25) is not None
        assert _sent_before_marker(replier, client, "u-1") == [pr.SUCCESS]
        _data, headers = client.responses["u-1"][0]
        assert Headers.parse(headers).run_s == 0.25


def test_give_back_answers_once_with_the_attempt():
    with replier_and_client() as (replier, memory, client):
        entry = _hold(memory, client, attempt=2)
        error = exc.WorkerShutdown("stopped")
        assert replier.give_back(KEY[:2], error) is True
        # A second give-back (or one racing the outcome) sends nothing more
        assert replier.give_back(KEY[:2], error) is True
        assert entry.state == held.ANSWERED
        assert replier.give_back(("other", pr.EXECUTE), error) is False
        assert _sent_before_marker(replier, client, "u-1") == [pr.FAILURE]
        data, headers = client.responses["u-1"][0]
        assert headers[pr.HEADER_ATTEMPT] == 2
        assert any(
            name.endswith("WorkerShutdown") for name in data["data"]["result"]["exc_type_names"]
        )


@pytest.mark.parametrize("pending_too,expected", [(True, [pr.PENDING]), (False, [])])
def test_a_duplicate_of_a_queued_request_hears_pending_only_from_flowengine(pending_too, expected):
    with replier_and_client() as (replier, memory, client):
        entry = _hold(memory, client)
        state, outcome = replier.repeat_state(entry, client.uuid, "u-1", pending_too)
        assert (state, outcome) == (held.QUEUED, None)
        assert _sent_before_marker(replier, client, "u-1") == expected


def test_a_duplicate_of_an_answered_request_gets_its_outcome_not_its_state():
    with replier_and_client() as (replier, memory, client):
        entry = _hold(memory, client)
        memory.start(KEY)
        body = {"state": pr.SUCCESS, "data": {"result": 5}}
        replier.answering(entry, body)
        assert replier.repeat_state(entry, client.uuid, "u-1", True) == (held.ANSWERED, body)
        assert _sent_before_marker(replier, client, "u-1") == []


@pytest.mark.parametrize("period_s,announced", [(0.0, True), (3600.0, False)])
def test_a_heartbeat_round_announces_the_worker_only_when_due(period_s, announced):
    with replier_and_client(announce_period_s=period_s) as (replier, _memory, client):
        replier.beat()
        _sent_before_marker(replier, client, "none")
        mine = [(d, h) for d, h in client.notifies if h.get(pr.HEADER_WORKER_ID) == "w-1"]
        assert bool(mine) is announced
        if announced:
            assert mine[0][0] == {"topic": TOPIC, "tasks": ["tasks.A", "tasks.B"]}


def test_a_leaving_announcement_lists_no_tasks():
    with replier_and_client() as (replier, _memory, client):
        replier.announce(leaving=True)
        assert client.wait_for(lambda: any(h.get(pr.HEADER_LEAVING) for _d, h in client.notifies))
        data, headers = client.notifies[-1]
        assert data == {"topic": TOPIC, "tasks": []} and headers[pr.HEADER_WORKER_ID] == "w-1"


def test_the_heartbeat_thread_repeats_what_is_held_and_reannounces(broker):
    # Given a replier on a real broker that announces at every round, holding
    # a request for a flowengine executor
    with replier_and_client(
        announce_period_s=0.0, interval_s=lv.MIN_HEARTBEAT_INTERVAL_S, **conn_kwargs(broker)
    ) as (replier, memory, client):
        entry = _hold(memory, client)
        # When its heartbeat thread runs
        replier.start()
        # Then the request is heartbeated (PENDING) and the worker re-announced,
        # round after round
        assert client.wait_for(lambda: client.states("u-1").count(pr.PENDING) >= 2)
        assert client.wait_for(lambda: announcements(client) >= 2)
        # And once it is answered (every heartbeat sent before has arrived),
        replier.answering(entry)
        before = _sent_before_marker(replier, client, "u-1")
        # whole rounds later no heartbeat followed
        rounds = announcements(client)
        assert client.wait_for(lambda: announcements(client) >= rounds + 2)
        assert _sent_before_marker(replier, client, "u-1") == before


def announcements(client: Client) -> int:
    return sum(h.get(pr.HEADER_WORKER_ID) == "w-1" for _d, h in client.notifies)


def test_no_announcement_while_the_proxy_is_not_consuming():
    # Given a replier whose proxy has no broker connection (not consuming)
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    broker = as_broker({"transport": "memory"})["broker"]
    identity = Identity("w-1", "host:1", TOPIC, ("tasks.A",))
    replier = Replier(
        Proxy(TOPIC, exchange, broker=broker),
        held.RequestMemory(),
        identity,
        INTERVAL_S,
        MiddlewareChain(),
        announce_period_s=0.0,
    )
    with Client(exchange, transport="memory") as client:
        # When a heartbeat round finds an announcement due
        replier.beat()
        # Then nothing was sent (the consumer announces when it is back)
        marker = f"marker-{uuid.uuid4().hex}"
        assert replier.reply(client.uuid, marker, pr.SUCCESS, result=None)
        assert client.wait_for(lambda: client.states(marker) != [])
        assert announcements(client) == 0
