"""On AMQP a late-PENDING request run on the consume loop is acknowledged after its outcome.

See Intake (settle_after_run): a request whose engine takes PENDING late
(header ``late_pending``) and that runs on the consume loop's own thread
(short_bodies.py) keeps its message unacknowledged until its outcome is
sent. Should its worker's connection end while it runs, RabbitMQ gives the
message to another worker, flagged as a redelivery, which hands it back
to the engine unrun (declined) instead of the request being lost with a
worker nobody knew held it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import short_tasks as st
from test_short_bodies import CONSUME_THREAD, run_one_by_one, sent_now
from wire_helpers import Client, running_worker

from flowengine import engines
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import names
from flowengine.engines.worker_based.worker_side import replier as replier_mod
from flowengine.engines.worker_based.worker_side import short_bodies as sb
from flowengine.patterns import linear_flow
from tests import faultproxy, waiting

pytestmark = pytest.mark.broker

WAIT_S = 20.0

#: A trivial body's 1 ms bound (SHORT_BODY_S) is overrun now and then on a
#: loaded machine: the streak these tests need must not depend on it.
TEST_SHORT_BODY_S = 0.1


@pytest.fixture(autouse=True)
def _gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sb, "SHORT_BODY_S", TEST_SHORT_BODY_S)
    # The held request must not be told late (PENDING/RUNNING) while the
    # test holds it: it stays a request nobody but its worker knows of.
    monkeypatch.setattr(replier_mod, "RUNNING_REPLY_DELAY_S", 60.0)
    for event in (st.HOLD_NEXT, st.HELD, st.OPEN):
        event.clear()
    st.GATED_RUNS.clear()
    st.HOLD_NAME = None
    yield
    st.HOLD_NAME = None
    st.OPEN.set()  # a failing test leaves no body waiting


def _late() -> dict:
    return {pr.HEADER_ATTEMPT: 0, names.HEADER_LATE_PENDING: True, **sent_now()}


def test_a_late_request_run_on_the_loop_comes_back_if_its_worker_loses_the_broker(amqp_url):
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    with (
        faultproxy.running(faultproxy.port_of(amqp_url)) as link,
        Client(exchange, url=amqp_url) as client,
        running_worker(exchange, "a", [st.Gated], threads_count=2, url=link.url(amqp_url)) as first,
    ):
        # Given a worker that runs Gated requests on its consume loop's thread
        warm = run_one_by_one(client, st.Gated(), sb.SHORT_STREAK + 1, settled=first)
        assert warm[-1] == CONSUME_THREAD, warm
        # And a late-PENDING request of it running there, not told to anyone yet
        st.HOLD_NEXT.set()
        cid = client.request(st.Gated(), routing_key="a", headers=_late())
        assert st.HELD.wait(WAIT_S)
        assert st.GATED_RUNS[-1] == CONSUME_THREAD
        assert client.states(cid) == []
        with running_worker(exchange, "a", [st.Gated], threads_count=2, url=amqp_url) as second:
            # When its worker's link to the broker is cut while it runs
            assert link.cut() >= 1
            # Then the broker gives the request to the other worker, which
            # hands it back to its engine unrun (a declined redelivery)
            assert client.wait_for(
                lambda: any(
                    headers.get(names.HEADER_DECLINED)
                    and headers.get(pr.HEADER_WORKER_ID) == second.worker_id
                    for _data, headers in client.responses.get(cid, [])
                ),
                WAIT_S,
            ), client.responses.get(cid)
            # And the first worker, still alive, sends the outcome once it ran
            st.OPEN.set()
            assert client.final(cid, WAIT_S)["state"] == pr.SUCCESS
    # The request ran once: the warm-up's runs and the held one
    assert len(st.GATED_RUNS) == sb.SHORT_STREAK + 2, st.GATED_RUNS


def test_a_late_request_run_on_the_loop_is_acknowledged_once_answered(amqp_url):
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    with (
        Client(exchange, url=amqp_url) as client,
        running_worker(exchange, "a", [st.Gated], threads_count=2, url=amqp_url) as worker,
    ):
        warm = run_one_by_one(client, st.Gated(), sb.SHORT_STREAK + 1, settled=worker)
        assert warm[-1] == CONSUME_THREAD, warm
        # Given late-PENDING requests answered on the loop, one after another
        for _ in range(3):
            cid = client.request(st.Gated(), routing_key="a", headers=_late())
            assert client.final(cid, WAIT_S)["state"] == pr.SUCCESS
            # Then each gets its outcome only (no PENDING)
            assert client.states(cid) == [pr.SUCCESS]
            assert worker.server.memory.wait_until_at_most(0, threading.Event(), WAIT_S)
    assert st.GATED_RUNS[-3:] == [CONSUME_THREAD] * 3
    # And, the worker gone, none is back in its queue (each was acknowledged)
    assert _messages_in(amqp_url, pr.topic_queue_name(exchange, "a")) == 0
    assert len(st.GATED_RUNS) == sb.SHORT_STREAK + 1 + 3, st.GATED_RUNS


def _messages_in(url: str, queue: str) -> int:
    """Messages ready in ``queue`` (the queue is deleted afterwards)."""
    with kombu.Connection(url) as conn:
        channel = conn.channel()
        count: int = channel.queue_declare(queue, passive=True).message_count
        channel.queue_delete(queue)
        return count


def test_a_late_request_for_the_pool_is_told_pending_with_its_acknowledgement(amqp_url):
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    with (
        Client(exchange, url=amqp_url) as client,
        running_worker(exchange, "a", [st.Gated], threads_count=2, url=amqp_url),
    ):
        # Given a class whose requests go to the pool (none ran short here yet)
        # When a late-PENDING request of it is taken
        cid = client.request(st.Gated(), routing_key="a", headers=_late())
        # Then it is told PENDING first, as a request without the header is:
        # its message is acknowledged, and its engine knows who holds it
        assert client.final(cid, WAIT_S)["state"] == pr.SUCCESS
        assert client.states(cid)[0] == pr.PENDING, client.states(cid)
    assert st.GATED_RUNS[0].startswith("flowengine-pool-a"), st.GATED_RUNS


#: The held task of the engine tests, after a streak that makes its class short.
HELD_TASK = "g-held"


def _gated_chain() -> linear_flow.Flow:
    tasks = [st.Gated(f"g{i}") for i in range(sb.SHORT_STREAK + 1)]
    return linear_flow.Flow("chain").add(*tasks, st.Gated(HELD_TASK))


@contextlib.contextmanager
def _running(engine: Any) -> Iterator[tuple[threading.Event, list[BaseException]]]:
    """Run ``engine`` in a thread: an event set once it ended, and the errors it raised."""
    ended, errors = threading.Event(), []

    def run() -> None:
        try:
            engine.run()
        except BaseException as e:  # the test reports it
            errors.append(e)
        finally:
            ended.set()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        yield ended, errors
    finally:
        runner.join(ENGINE_WAIT_S)
        assert not runner.is_alive(), "the engine did not finish"


#: Bound (s) on an engine's run: only so that a bug fails instead of hanging.
ENGINE_WAIT_S = 30.0


def _late_gated_engine(exchange: str, amqp_url: str, **policy: Any) -> Any:
    """A worker-based engine of the gated chain on topic 'a', taking late PENDINGs."""
    return engines.load(
        _gated_chain(),
        engine="worker-based",
        exchange=exchange,
        topics=["a"],
        url=amqp_url,
        late_pending=True,
        **policy,
    )


def test_a_late_request_whose_worker_vanished_before_telling_runs_elsewhere(amqp_url):
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    st.HOLD_NAME = HELD_TASK
    with (
        faultproxy.running(faultproxy.port_of(amqp_url)) as link,
        running_worker(exchange, "a", [st.Gated], threads_count=2, url=link.url(amqp_url)),
    ):
        engine = _late_gated_engine(exchange, amqp_url, lost_after=0.5, transition_timeout=10.0)
        # Given an engine's late-PENDING request running on a worker's consume
        # loop, a chain's last, its holder not told to anyone yet
        with _running(engine) as (ended, errors):
            assert st.HELD.wait(WAIT_S)
            assert st.GATED_RUNS[-1] == CONSUME_THREAD, st.GATED_RUNS
            with running_worker(exchange, "a", [st.Gated], threads_count=2, url=amqp_url):
                # When that worker vanishes from the network (as if it died)
                link.blackhole()
                assert link.cut() >= 1
                assert ended.wait(ENGINE_WAIT_S)
        # Then the request is run again elsewhere (the broker gave it back,
        # another worker handed it back, nobody claimed it): no RequestTimeout
        assert errors == []
        # (on the second worker: the first one's body still waits)
        assert engine.storage.get(HELD_TASK).startswith("flowengine-pool-a")
        assert len(st.GATED_RUNS) == sb.SHORT_STREAK + 3, st.GATED_RUNS
        # (the vanished worker's body ends; what it sends goes nowhere)
        st.OPEN.set()
        link.heal()


def test_a_late_request_whose_worker_lost_the_broker_while_alive_runs_once(amqp_url, caplog):
    caplog.set_level(logging.INFO, "flowengine.engines.worker_based.executor_side")
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    st.HOLD_NAME = HELD_TASK
    with (
        faultproxy.running(faultproxy.port_of(amqp_url)) as link,
        running_worker(
            exchange,
            "a",
            [st.Gated],
            threads_count=2,
            url=link.url(amqp_url),
            heartbeat_interval=0.2,
        ),
    ):
        # A loss bound long enough for the cut worker to reconnect and speak
        engine = _late_gated_engine(exchange, amqp_url, lost_after=10.0)
        with _running(engine) as (ended, errors):
            # Given a late-PENDING request running on a worker's consume loop
            assert st.HELD.wait(WAIT_S)
            assert st.GATED_RUNS[-1] == CONSUME_THREAD, st.GATED_RUNS
            with running_worker(exchange, "a", [st.Gated], threads_count=2, url=amqp_url):
                # When that worker's connections are cut while it runs (it lives on)
                assert link.cut() >= 1
                # Then the other worker gets the message again and hands it back;
                # the engine waits for a holder, the first worker's heartbeat
                # names it, and its outcome completes the request
                waiting.wait_until(
                    lambda: "handed back a redelivery" in caplog.text,
                    "the engine to hear of the redelivery",
                    timeout=WAIT_S,
                )
                st.OPEN.set()
                assert ended.wait(ENGINE_WAIT_S)
        assert errors == []
    # And the request ran once
    assert len(st.GATED_RUNS) == sb.SHORT_STREAK + 2, st.GATED_RUNS
