"""flowengine's Redis transport keeps its promises against a real redis-server.

What is proved here (see transports/redis.py, redis_consumers.py, leases.py):
a message is always in a queue or held by a named consumer; a dead
consumer's holdings go back to their queue (and its private queues go) once
its lease lapsed, never while it lives; settling with a reply is one atomic,
idempotent step that fails once the message was given away; plain kombu
interoperates; a lost ``BLMOVE`` answer or a dropped connection loses
nothing; poison payloads are dropped; a worker never runs a request whose
message it could not settle, nor settle what another consumer got after
a reclaim; a consumer reclaimed while frozen learns it on its next renewal.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from kombu.transport import redis as kombu_redis
from wire_helpers import Client, running_worker

import flowengine
from flowengine import exceptions as exc
from flowengine import task
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import leases
from flowengine.engines.worker_based.transports import redis as redis_transport
from flowengine.engines.worker_based.transports import redis_consumers as rc
from flowengine.utils import redis_identity
from tests import waiting
from tests.worker_based import redis_stats

pytestmark = pytest.mark.broker

OURS = "flowengine-redis"
KOMBU_REDIS = "kombu.transport.redis:Transport"

#: Bound (s) on every wait: only there to fail instead of hanging.
WAIT_S = 15.0
#: Pause (s) between two looks at a condition that has no event to wait on.
POLL_S = 0.01
#: A short lease (s), so that a dead consumer is reclaimed within a second.
SHORT_LEASE_S = 0.3
#: A lease (s) no test outlives: nobody is reclaimed by accident.
LONG_LEASE_S = 30.0

ROOT = Path(__file__).resolve().parents[3]
CONSUMER_SCRIPT = Path(__file__).resolve().parent.parent / "redis_transport_consumer.py"
SEP = "\x06\x16"  # kombu's separator inside a binding entry
WORK_KEY = "work"
REPLY_KEY = "reply"
PRIVATE_KEY = "private"
TEST_TYPE = "REDIS_TRANSPORT_TEST"


# --- helpers ---


class Names:
    """The exchange and queue names of one test (fresh per test)."""

    def __init__(self, unique: str) -> None:
        self.exchange = unique
        self.work = f"{unique}.work"
        self.reply = f"{unique}.reply"
        self.private = f"{unique}.private"
        self.consumer = f"{unique}-consumer"

    def kombu_exchange(self) -> kombu.Exchange:
        return kombu.Exchange(self.exchange, type="direct")

    def queue(self, which: str) -> kombu.Queue:
        name, key = {
            "work": (self.work, WORK_KEY),
            "reply": (self.reply, REPLY_KEY),
            "private": (self.private, PRIVATE_KEY),
        }[which]
        return kombu.Queue(name, self.kombu_exchange(), routing_key=key)


@pytest.fixture
def names(unique_name: str) -> Names:
    return Names(unique_name)


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    """Cleanups run after the test, last registered first."""
    with contextlib.ExitStack() as s:
        yield s


def connect(
    stack: contextlib.ExitStack,
    url: str,
    consumer: str | None = None,
    lease_s: float = LONG_LEASE_S,
    transport: str = OURS,
) -> kombu.Connection:
    """A kombu connection on ``transport`` (ours: as ``consumer`` with ``lease_s``)."""
    options = {}
    if transport == OURS:
        options = {rc.CONSUMER_OPTION: consumer or uuid.uuid4().hex, rc.LEASE_OPTION: lease_s}
    conn = kombu.Connection(url, transport=transport, transport_options=options)
    stack.callback(conn.release)
    return conn


def inspector(stack: contextlib.ExitStack, url: str) -> redis.Redis:
    """A plain Redis client to look at (and meddle with) the keys."""
    client = redis.Redis.from_url(url)
    stack.callback(client.close)
    return client


def keeper(
    stack: contextlib.ExitStack,
    conn: kombu.Connection,
    consumer: str,
    lease_s: float,
    reclaim: bool,
) -> leases.LeaseKeeper:
    """A LeaseKeeper for ``consumer`` retired after the test (if still registered).

    Its template is a clone made here: the keeper clones its template from
    its own thread, and kombu creates a connection's transport lazily without
    a lock, so a template the test also uses could end up with two transports.
    """
    k = leases.LeaseKeeper(conn.clone(), consumer, lease_s, reclaim)
    stack.callback(k.stop, retire=True)
    return k


def declare(conn: kombu.Connection, *queues: kombu.Queue) -> None:
    channel = conn.channel()
    for queue in queues:
        queue(channel).declare()
    channel.close()


def publish(
    conn: kombu.Connection, names: Names, body: Any, routing_key: str = WORK_KEY, **properties: Any
) -> None:
    channel = conn.channel()
    kombu.Producer(channel, exchange=names.kombu_exchange()).publish(
        body, routing_key=routing_key, **properties
    )
    channel.close()


class Taker:
    """Consumes one queue on its own channel and collects what it is given."""

    def __init__(
        self,
        conn: kombu.Connection,
        queue: kombu.Queue,
        channel: Any = None,
        prefetch_count: int | None = 1,
    ) -> None:
        self.conn = conn
        self.channel = channel or conn.channel()
        self.messages: list[kombu.Message] = []
        self.consumer = kombu.Consumer(
            self.channel,
            queues=[queue],
            accept=["json"],
            on_message=self.messages.append,
            prefetch_count=prefetch_count,
        )
        self.consumer.consume()

    def next(self, timeout: float = WAIT_S) -> kombu.Message:
        """The next message given (fails the test when none comes in ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self.messages:
            left = deadline - time.monotonic()
            assert left > 0, "no message was delivered"
            with contextlib.suppress(TimeoutError):
                self.conn.drain_events(timeout=min(left, 1.0))
        return self.messages.pop(0)


#: tests.waiting.wait_until with this module's bound and pace.
wait_until = functools.partial(waiting.wait_until, timeout=WAIT_S, poll_s=POLL_S)


def wait_for_renewal(r: redis.Redis, consumer: str) -> None:
    """Return once ``consumer``'s lease was renewed (its time to live went up)."""
    deadline = time.monotonic() + WAIT_S
    last = r.pttl(rc.lease_key(consumer))
    while True:
        now = r.pttl(rc.lease_key(consumer))
        if now > last:
            return
        assert time.monotonic() < deadline, f"{consumer} did not renew its lease"
        last = now
        time.sleep(POLL_S)


def tags(r: redis.Redis, key: str) -> list[str]:
    """Delivery tags of the kombu messages in list ``key``, oldest first."""
    return [json.loads(raw)["properties"]["delivery_tag"] for raw in reversed(r.lrange(key, 0, -1))]


def inflight(consumer: str, queue: str) -> str:
    return rc.inflight_key(consumer, queue)


def bound_to(r: redis.Redis, exchange: str, queue: str) -> list[bytes]:
    """Binding entries of ``exchange`` (kombu's and its permanent copy) naming ``queue``."""
    entries = []
    for key in (f"_kombu.binding.{exchange}", f"_kombu.binding_permanent.{exchange}"):
        entries += [m for m in r.smembers(key) if m.decode().split(SEP)[-1] == queue]
    return entries


def start_consumer_process(
    stack: contextlib.ExitStack, tmp_path: Path, url: str, names: Names, consumer: str
) -> tuple[subprocess.Popen, Path, Path]:
    """redis_transport_consumer.py as ``consumer``; (process, marker path, log path)."""
    marker, log_path = tmp_path / "taken.json", tmp_path / "consumer.log"
    config = {
        "url": url,
        "exchange": names.exchange,
        "queue": names.work,
        "routing_key": WORK_KEY,
        "private_queue": names.private,
        "private_key": PRIVATE_KEY,
        "consumer_id": consumer,
        "lease_s": SHORT_LEASE_S,
        "marker": str(marker),
    }
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(CONSUMER_SCRIPT), json.dumps(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )

    def reap() -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT_S)

    stack.callback(reap)
    return proc, marker, log_path


# --- 1. a dead consumer's holdings come back; its private queue goes ---


@pytest.mark.slow
def test_a_killed_consumers_message_goes_to_the_next_consumer(
    private_redis, names, tmp_path, stack
):
    url = private_redis.url
    r = inspector(stack, url)
    pub = connect(stack, url)
    declare(pub, names.queue("work"))
    # Given a work message waiting in a shared queue
    publish(pub, names, {"job": 1}, correlation_id="job-1")
    # When a consumer process (lease 0.3 s, kept alive) takes it and never settles it
    dead = f"{names.consumer}-dead"
    proc, marker, log_path = start_consumer_process(stack, tmp_path, url, names, dead)
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, "the consumer took it")
    finally:
        assert marker.exists(), f"consumer did not take it; its log:\n{log_path.read_text()}"
    taken = json.loads(marker.read_text())
    # Then the message is held in that consumer's in-flight list, not in the queue
    assert taken["body"] == {"job": 1} and taken["correlation_id"] == "job-1"
    assert r.llen(names.work) == 0
    assert tags(r, inflight(dead, names.work)) == [taken["delivery_tag"]]
    # and its private queue exists and is bound
    publish(pub, names, {"to": "the dead one"}, routing_key=PRIVATE_KEY)
    assert r.exists(names.private) == 1 and bound_to(r, names.exchange, names.private)

    # When the holder is killed and a reclaiming consumer looks at once
    proc.kill()
    proc.wait(WAIT_S)
    alive = f"{names.consumer}-alive"
    conn = connect(stack, url, alive, SHORT_LEASE_S)
    reclaimer = keeper(stack, conn, alive, SHORT_LEASE_S, reclaim=True)
    reclaimer.renew_once()
    # Then nothing is reclaimed yet: the lease is still running, or seen
    # missing for the first time (which may be a Redis restart; it must stay
    # missing for a whole lease period)
    assert r.llen(names.work) == 0
    assert tags(r, inflight(dead, names.work)) == [taken["delivery_tag"]]

    # When the reclaimer keeps renewing and consumes the queue
    taker = Taker(conn, names.queue("work"))
    reclaimer.start()
    message = taker.next()
    # Then it is given the very message the dead consumer held
    assert message.delivery_tag == taken["delivery_tag"]
    assert message.decode() == {"job": 1}
    assert message.properties["correlation_id"] == "job-1"
    # (the keeper counts it once its renewal returns, maybe after the delivery)
    wait_until(lambda: reclaimer.reclaimed_count == 1, "the reclaimer counted it")
    # and the dead consumer's private queue, bindings and lease are gone
    assert r.exists(names.private) == 0
    assert bound_to(r, names.exchange, names.private) == []
    assert bound_to(r, names.exchange, names.work)  # shared bindings stay
    assert not r.hexists(rc.REGISTRY_KEY, dead)
    # ...except its bookkeeping sets, left to expire (a consumer that was only
    # frozen finds them when it wakes; a dead one's go)
    left = sorted(k.decode() for k in r.keys(f"{rc.CONSUMER_PREFIX}{dead}.*"))
    assert all(k.rsplit(".", 1)[1] in ("queues", "private", "bindings") for k in left), left
    assert all(0 < r.pttl(k) <= rc.RECLAIMED_KEEP_MS for k in left), left
    message.ack()
    assert r.llen(inflight(alive, names.work)) == 0


# --- 2. settling with a reply: atomic, idempotent, refused once given away ---


@pytest.mark.parametrize("lose_first_answer", [False, True], ids=["answered", "answer-lost"])
def test_a_reply_settles_the_message_it_answers_in_one_step(
    redis_url, names, stack, monkeypatch, lose_first_answer
):
    r = inspector(stack, redis_url)
    setup = connect(stack, redis_url)
    declare(setup, names.queue("work"), names.queue("reply"))
    settles: list[bool] = []
    real_settle = rc.settle

    def settle(
        client: Any, held_in: str, raw: bytes, tag: str, nonce: str, pushes: list, queue: str = ""
    ) -> bool:
        settled = real_settle(client, held_in, raw, tag, nonce, pushes, queue)
        if b"request-1" in raw:
            settles.append(settled)
            if lose_first_answer and len(settles) == 1:
                # Redis did it, but its answer never reached us.
                raise redis.exceptions.ConnectionError("answer lost (test)")
        return settled

    monkeypatch.setattr(rc, "settle", settle)
    seen: dict[str, Any] = {}
    handled = threading.Event()

    def state() -> tuple[int, int]:
        return r.llen(inflight(names.consumer, names.work)), r.llen(names.reply)

    def on_request(data: Any, message: Any) -> None:
        seen["before"] = state()
        try:
            proxy.publish(
                pr.Response(pr.PENDING),
                REPLY_KEY,
                correlation_id=message.properties["correlation_id"],
                settles=message,
            )
        except Exception as e:
            seen["error"] = e
        seen["after"] = state()
        handled.set()

    handler = dispatcher.Handler(on_request, settles=True)
    proxy = px.Proxy(
        WORK_KEY,
        names.exchange,
        {TEST_TYPE: handler},
        broker=BrokerSettings(redis_url),
        options=px.ProxyOptions(
            queues=[px.QueueSpec(names.work, (WORK_KEY,))],
            wake_routing_key=WORK_KEY,
            consume=px.ConsumeOptions(lease=px.LeaseSpec(names.consumer, LONG_LEASE_S)),
        ),
    )
    thread = threading.Thread(target=proxy.start, daemon=True)
    thread.start()
    stack.callback(thread.join, WAIT_S)
    stack.callback(proxy.stop)
    assert proxy.wait(WAIT_S)
    # Given a request held by a consumer (the proxy) that has not answered it
    publish(setup, names, {"n": 1}, type=TEST_TYPE, correlation_id="request-1")
    # When it answers with a reply that settles it
    assert handled.wait(WAIT_S)
    # Then the request left the in-flight list and the reply arrived, together,
    # and a retry after a lost answer neither failed nor pushed a second reply
    assert "error" not in seen, seen.get("error")
    assert seen["before"] == (1, 0)
    assert seen["after"] == (0, 1)
    assert settles == ([True, True] if lose_first_answer else [True])
    reply = json.loads(r.lindex(names.reply, 0))
    assert reply["properties"]["correlation_id"] == "request-1"
    assert reply["properties"]["type"] == pr.RESPONSE
    assert r.llen(names.work) == 0


@pytest.mark.parametrize("how", ["settle_with", "ack"])
def test_settling_a_message_given_back_by_a_reclaim_fails_and_pushes_nothing(
    redis_url, names, stack, how
):
    r = inspector(stack, redis_url)
    conn = connect(stack, redis_url, names.consumer)
    declare(conn, names.queue("work"), names.queue("reply"))
    publish(conn, names, {"n": 1})
    # Given a message held by a consumer
    message = Taker(conn, names.queue("work")).next()
    # When that consumer is reclaimed (what happens once its lease lapsed)
    assert rc.reclaim(r, names.consumer) == 1
    assert tags(r, names.work) == [message.delivery_tag]
    # Then settling it (with a reply, or a plain ack) is refused
    with pytest.raises(exc.DeliveryNotSettled, match="another consumer"):
        if how == "settle_with":
            message.channel.settle_with(
                message.delivery_tag, [(names.reply, b'{"reply": 1}')], message.channel.client
            )
        else:
            message.ack()
    # and pushes nothing, and the message still waits for the next consumer
    assert r.llen(names.reply) == 0
    assert tags(r, names.work) == [message.delivery_tag]


def test_a_stale_holder_cannot_settle_what_another_consumer_settled(redis_url, names, stack):
    r = inspector(stack, redis_url)
    stale_conn = connect(stack, redis_url, f"{names.consumer}-stale")
    other_conn = connect(stack, redis_url, f"{names.consumer}-other")
    declare(stale_conn, names.queue("work"), names.queue("reply"))
    publish(stale_conn, names, {"n": 1})
    # Given a message held by a consumer that froze past its lease: reclaimed,
    # given to another consumer, which settled it
    stale = Taker(stale_conn, names.queue("work")).next()
    rc.reclaim(r, f"{names.consumer}-stale")
    other = Taker(other_conn, names.queue("work")).next()
    assert other.delivery_tag == stale.delivery_tag
    other.ack()
    # When the frozen consumer wakes up and settles it with its reply
    # Then it is refused (it must not run the request a second time) and pushes nothing
    with pytest.raises(exc.DeliveryNotSettled):
        stale.channel.settle_with(
            stale.delivery_tag, [(names.reply, b'{"reply": 1}')], stale.channel.client
        )
    assert r.llen(names.reply) == 0


def test_of_two_copies_of_one_message_only_the_first_settled_is_handled(redis_url, names, stack):
    r = inspector(stack, redis_url)
    first_conn = connect(stack, redis_url, f"{names.consumer}-1")
    second_conn = connect(stack, redis_url, f"{names.consumer}-2")
    declare(first_conn, names.queue("work"), names.queue("reply"))
    # Given one message queued twice, as a publication sent again after its
    # answer was lost (a failed-over master) leaves it: same bytes, same tag
    publish(first_conn, names, {"n": 1})
    r.rpush(names.work, r.lindex(names.work, 0))
    # When two consumers each take a copy and settle it with their reply
    first = Taker(first_conn, names.queue("work")).next()
    second = Taker(second_conn, names.queue("work")).next()
    assert first.delivery_tag == second.delivery_tag
    first.channel.settle_with(
        first.delivery_tag, [(names.reply, b'{"reply": 1}')], first.channel.client
    )
    # Then the second is refused (it must not run it too), pushes nothing and
    # holds nothing more
    with pytest.raises(exc.DeliveryNotSettled):
        second.channel.settle_with(
            second.delivery_tag, [(names.reply, b'{"reply": 2}')], second.channel.client
        )
    assert r.lrange(names.reply, 0, -1) == [b'{"reply": 1}']
    assert r.llen(inflight(f"{names.consumer}-2", names.work)) == 0


def test_a_message_routed_to_two_queues_is_settled_in_each(redis_url, names, stack):
    other = kombu.Queue(f"{names.exchange}.other", names.kombu_exchange(), routing_key=WORK_KEY)
    first_conn = connect(stack, redis_url, f"{names.consumer}-1")
    second_conn = connect(stack, redis_url, f"{names.consumer}-2")
    declare(first_conn, names.queue("work"), other)
    # Given one publication that reached two queues (one tag in both)
    publish(first_conn, names, {"n": 1})
    first = Taker(first_conn, names.queue("work")).next()
    second = Taker(second_conn, other).next()
    assert first.delivery_tag == second.delivery_tag
    # When each queue's consumer settles its message, Then both are settled
    first.ack()
    second.ack()


def test_a_publication_sent_again_after_a_lost_answer_keeps_its_delivery_tag(
    redis_url, names, stack, monkeypatch
):
    from flowengine.engines.worker_based.messaging.publisher import Publisher
    from flowengine.engines.worker_based.messaging.settings import BrokerSettings

    r = inspector(stack, redis_url)
    declare(connect(stack, redis_url), names.queue("work"))
    real_publish = rc.publish
    answers_lost: list[int] = []

    def publish_losing_the_first_answer(client: Any, pushes: Any) -> int:
        made = real_publish(client, pushes)
        if not answers_lost:
            answers_lost.append(made)
            raise redis.exceptions.ConnectionError("answer lost (test)")
        return made

    monkeypatch.setattr(rc, "publish", publish_losing_the_first_answer)
    publisher = Publisher(BrokerSettings(redis_url, secret=False), names.kombu_exchange())
    stack.callback(publisher.close_if_idle)
    # When a publication's answer is lost after Redis queued it, and it is sent again
    publisher.publish(TEST_TYPE, {"n": 1}, WORK_KEY)
    # Then both copies carry one delivery tag (so only one is ever handled)
    copies = [json.loads(raw) for raw in r.lrange(names.work, 0, -1)]
    assert answers_lost == [1] and len(copies) == 2
    assert copies[0]["properties"]["delivery_tag"] == copies[1]["properties"]["delivery_tag"]


# --- 3. plain kombu and ours share queues ---


@pytest.mark.parametrize(
    ("publisher", "consumer"),
    [(KOMBU_REDIS, OURS), (OURS, KOMBU_REDIS)],
    ids=["kombu-to-ours", "ours-to-kombu"],
)
def test_plain_kombu_and_ours_exchange_messages(redis_url, names, stack, publisher, consumer):
    r = inspector(stack, redis_url)
    sender = connect(stack, redis_url, transport=publisher)
    receiver = connect(stack, redis_url, names.consumer, transport=consumer)
    declare(receiver, names.queue("work"))
    taker = Taker(receiver, names.queue("work"))
    # Given a message published by one transport
    publish(sender, names, {"from": publisher}, correlation_id="interop-1", headers={"h": 1})
    # When the other consumes it
    message = taker.next()
    # Then it gets it whole, and acknowledging it leaves nothing behind
    assert message.decode() == {"from": publisher}
    assert message.properties["correlation_id"] == "interop-1"
    assert message.headers == {"h": 1}
    message.ack()
    assert r.llen(names.work) == 0
    assert r.llen(inflight(names.consumer, names.work)) == 0
    assert not r.hexists("unacked", message.delivery_tag)


# --- 4. a lost BLMOVE answer / a dropped connection loses nothing ---


def test_a_take_whose_answer_was_lost_comes_back_when_its_consumer_consumes_again(
    redis_url, names, stack, caplog
):
    r = inspector(stack, redis_url)
    setup = connect(stack, redis_url)
    declare(setup, names.queue("work"))
    publish(setup, names, {"n": 1}, correlation_id="lost-1")
    # Given a message Redis moved into a consumer's in-flight list (its BLMOVE)
    # whose answer never reached the consumer (its connection dropped)
    assert r.lmove(names.work, inflight(names.consumer, names.work), "RIGHT", "LEFT")
    [tag] = tags(r, inflight(names.consumer, names.work))
    # When another consumer starts consuming the queue
    Taker(connect(stack, redis_url, f"{names.consumer}-other"), names.queue("work"))
    # Then it does not take what the first one holds
    assert tags(r, inflight(names.consumer, names.work)) == [tag]
    # When the holder consumes again (new connection, same consumer id)
    with caplog.at_level(logging.WARNING, logger=redis_transport.__name__):
        message = Taker(connect(stack, redis_url, names.consumer), names.queue("work")).next()
    # Then its holding was put back, said so, and given to it again
    assert message.delivery_tag == tag
    assert message.properties["correlation_id"] == "lost-1"
    assert any(
        "Put back 1 message" in rec.getMessage() and names.work in rec.getMessage()
        for rec in caplog.records
    )
    message.ack()
    assert r.llen(inflight(names.consumer, names.work)) == 0


# --- 3b. replies: taken in batches, settled with the next take ---


def _batch_taker(
    stack: contextlib.ExitStack, url: str, names: Names, monkeypatch: pytest.MonkeyPatch
) -> tuple[Taker, list[int]]:
    """A Taker of the private queue marked for batches, and the sizes its takes asked for."""
    conn = connect(stack, url, names.consumer)
    channel = conn.channel()
    channel.mark_private(names.private)
    channel.take_in_batches(names.private)
    names.queue("private")(channel).declare()
    takes: list[int] = []
    real_take = rc.take

    def take(client: Any, queue: str, held_in: str, limit: int, settled: Any = ()) -> list[bytes]:
        takes.append(limit)
        return real_take(client, queue, held_in, limit, settled)

    monkeypatch.setattr(rc, "take", take)
    return Taker(conn, names.queue("private"), channel, prefetch_count=None), takes


def test_a_burst_of_replies_comes_in_one_take_and_is_settled_by_a_later_one(
    redis_url, names, stack, monkeypatch
):
    r = inspector(stack, redis_url)
    taker, takes = _batch_taker(stack, redis_url, names, monkeypatch)
    held_in = inflight(names.consumer, names.private)
    publisher = connect(stack, redis_url)
    # Given five replies waiting in a private queue taken in batches
    for n in range(5):
        publish(publisher, names, {"n": n}, routing_key=PRIVATE_KEY)
    # When its consumer polls once
    taker.conn.drain_events(timeout=WAIT_S)
    # Then all five are delivered, in order, by one BLMOVE and one take
    assert [m.payload["n"] for m in taker.messages] == list(range(5))
    assert takes == [redis_transport.TAKE_BATCH - 1]
    assert r.llen(held_in) == 5 and r.llen(names.private) == 0
    # When they are acknowledged: no round trip each, they stay in flight
    for message in taker.messages:
        message.ack()
    assert r.llen(held_in) == 5
    # When a lone reply comes: BLMOVE alone brings it, no take settles them yet
    taker.messages.clear()
    publish(publisher, names, {"n": 5}, routing_key=PRIVATE_KEY)
    sixth = taker.next()
    assert sixth.payload["n"] == 5
    assert takes == [redis_transport.TAKE_BATCH - 1]
    assert r.llen(held_in) == 6
    # Then a poll that finds the queue idle settles what was acknowledged
    sixth.ack()

    def idle_poll_settled() -> bool:
        with contextlib.suppress(TimeoutError):
            taker.conn.drain_events(timeout=POLL_S)
        return r.llen(held_in) == 0

    wait_until(idle_poll_settled, what="the handled replies settled by an idle poll")
    assert takes[1:] == [0]
    # And closing the channel settles what was acknowledged, puts back nothing
    publish(publisher, names, {"n": 6}, routing_key=PRIVATE_KEY)
    taker.next().ack()
    taker.channel.close()
    assert r.llen(held_in) == 0 and r.llen(names.private) == 0


def test_lone_replies_cost_no_take_and_are_settled_a_batch_at_a_time(
    redis_url, names, stack, monkeypatch
):
    r = inspector(stack, redis_url)
    taker, takes = _batch_taker(stack, redis_url, names, monkeypatch)
    held_in = inflight(names.consumer, names.private)
    publisher = connect(stack, redis_url)
    most_held = 0
    # Given replies that come one at a time, each handled before the next (a chain's)
    for n in range(redis_transport.TAKE_BATCH + 1):
        publish(publisher, names, {"n": n}, routing_key=PRIVATE_KEY)
        message = taker.next()
        assert message.payload["n"] == n
        most_held = max(most_held, r.llen(held_in))
        message.ack()
    # Then none was followed by a take for more (BLMOVE's LLEN said none waited),
    # and what was handled was settled in batches: the in-flight list stayed
    # bounded by TAKE_BATCH and a take settled the handled replies at least once
    assert redis_transport.TAKE_BATCH - 1 not in takes
    assert 1 <= len(takes) < 10 and set(takes) == {0}
    assert most_held <= redis_transport.TAKE_BATCH + 1
    assert r.llen(held_in) < redis_transport.TAKE_BATCH + 1


def test_replies_of_a_batch_not_acknowledged_go_back_in_order(redis_url, names, stack, monkeypatch):
    r = inspector(stack, redis_url)
    taker, _ = _batch_taker(stack, redis_url, names, monkeypatch)
    publisher = connect(stack, redis_url)
    for n in range(3):
        publish(publisher, names, {"n": n}, routing_key=PRIVATE_KEY)
    # Given a batch of three replies of which only the first was handled
    taker.conn.drain_events(timeout=WAIT_S)
    first, *unhandled = taker.messages
    first.ack()
    # When the consumer's channel closes
    taker.channel.close()
    # Then the two others are back at the head of the queue, in order; the first is gone
    assert tags(r, names.private) == [m.delivery_tag for m in unhandled]
    assert r.llen(inflight(names.consumer, names.private)) == 0


@pytest.mark.slow
def test_a_message_taken_before_a_redis_restart_is_put_back_on_reconnect(
    persistent_redis, names, stack
):
    url = persistent_redis.url
    r = inspector(stack, url)
    setup = connect(stack, url)
    declare(setup, names.queue("work"))
    deliveries: list[str] = []
    first_taken, let_go, ack_tried, again = (threading.Event() for _ in range(4))

    def on_message(data: Any, message: Any) -> None:
        deliveries.append(message.delivery_tag)
        if len(deliveries) == 1:
            first_taken.set()
            let_go.wait(WAIT_S)
            with contextlib.suppress(Exception):
                message.ack()  # Redis is down: this settles nothing
            ack_tried.set()
        else:
            again.set()

    handler = dispatcher.Handler(on_message, settles=True)  # held while it is handled
    proxy = px.Proxy(
        WORK_KEY,
        names.exchange,
        {TEST_TYPE: handler},
        broker=BrokerSettings(url),
        options=px.ProxyOptions(
            queues=[px.QueueSpec(names.work, (WORK_KEY,))],
            consume=px.ConsumeOptions(lease=px.LeaseSpec(names.consumer, LONG_LEASE_S)),
        ),
    )
    thread = threading.Thread(target=proxy.start, daemon=True)
    thread.start()
    stack.callback(thread.join, WAIT_S)
    stack.callback(proxy.stop)
    assert proxy.wait(WAIT_S)
    # Given a message the consumer took and is handling
    publish(setup, names, {"n": 1}, type=TEST_TYPE)
    assert first_taken.wait(WAIT_S)
    # When Redis dies before the consumer settles it, and comes back
    persistent_redis.kill()
    let_go.set()
    assert ack_tried.wait(WAIT_S)
    wait_until(lambda: not proxy.is_running, "the proxy saw its connection break")
    persistent_redis.start()
    # Then the consumer, consuming again, is given the same message once more
    assert again.wait(WAIT_S), "the held message was not put back"
    assert deliveries[0] == deliveries[1] and len(deliveries) == 2
    assert proxy.reconnect_count >= 1
    wait_until(
        lambda: r.llen(inflight(names.consumer, names.work)) == 0, "the second delivery was settled"
    )
    assert r.llen(names.work) == 0


# --- 5. poison payloads ---


@pytest.mark.parametrize(
    "raw", [b"\xff\xfe not json", b'{"body": "no properties"}'], ids=["not-json", "no-delivery-tag"]
)
def test_an_undecodable_payload_is_dropped_and_the_next_message_delivered(
    redis_url, names, stack, caplog, raw
):
    r = inspector(stack, redis_url)
    conn = connect(stack, redis_url, names.consumer)
    declare(conn, names.queue("work"))
    # Given a payload kombu cannot read, pushed raw ahead of a good message
    r.lpush(names.work, raw)
    publish(conn, names, {"good": True}, correlation_id="good-1")
    # When a consumer consumes the queue
    with caplog.at_level(logging.ERROR, logger=redis_transport.__name__):
        message = Taker(conn, names.queue("work")).next()
    # Then the good message is delivered, the bad one was dropped with an
    # ERROR naming the queue, and is held nowhere (no poison loop)
    assert message.properties["correlation_id"] == "good-1"
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert len(errors) == 1 and names.work in errors[0].getMessage()
    held = r.lrange(inflight(names.consumer, names.work), 0, -1)
    assert raw not in held and len(held) == 1
    assert tags(r, inflight(names.consumer, names.work)) == [message.delivery_tag]
    assert r.llen(names.work) == 0
    message.ack()
    assert r.llen(inflight(names.consumer, names.work)) == 0


# --- 6. leases: retiring, and never reclaiming a live consumer ---


def test_retiring_puts_holdings_back_and_deletes_private_queues(redis_url, names, stack, caplog):
    r = inspector(stack, redis_url)
    conn = connect(stack, redis_url, names.consumer)
    lease = keeper(stack, conn, names.consumer, LONG_LEASE_S, reclaim=False)
    lease.start()
    private_channel = conn.channel()
    private_channel.mark_private(names.private)
    declare(conn, names.queue("work"))
    names.queue("private")(private_channel).declare()
    publish(conn, names, {"n": 1})
    publish(conn, names, {"for": "me"}, routing_key=PRIVATE_KEY)
    # Given a consumer holding a message, with a private queue of its own
    message = Taker(conn, names.queue("work")).next()
    assert r.llen(inflight(names.consumer, names.work)) == 1
    assert r.exists(names.private) and bound_to(r, names.exchange, names.private)
    # When its keeper stops and retires it
    with caplog.at_level(logging.INFO, logger=leases.__name__):
        lease.stop(retire=True)
    # Then the unsettled message is back in its queue, the private queue and
    # its bindings are gone, and the consumer is no longer registered
    assert tags(r, names.work) == [message.delivery_tag]
    assert r.llen(inflight(names.consumer, names.work)) == 0
    assert r.exists(names.private) == 0
    assert bound_to(r, names.exchange, names.private) == []
    assert not r.hexists(rc.REGISTRY_KEY, names.consumer)
    assert r.exists(rc.lease_key(names.consumer)) == 0
    assert "put back 1 unsettled" in caplog.text
    # When its connection closes afterwards
    conn.release()
    # Then the message is not put back a second time
    assert tags(r, names.work) == [message.delivery_tag]


#: Renewals of the reclaimer watched while the holder lives: with renewals
#: every third of a lease, they span more than two lease periods, the time
#: after which a dead holder would have been reclaimed.
WATCHED_RENEWALS = 8


@pytest.mark.slow
def test_a_live_consumer_is_never_reclaimed_and_a_dead_one_is(private_redis, names, stack):
    url = private_redis.url
    r = inspector(stack, url)
    holder_conn = connect(stack, url, names.consumer, SHORT_LEASE_S)
    holder = keeper(stack, holder_conn, names.consumer, SHORT_LEASE_S, reclaim=False)
    holder.start()
    declare(holder_conn, names.queue("work"))
    publish(holder_conn, names, {"n": 1})
    # Given a consumer holding a message, its lease kept alive
    message = Taker(holder_conn, names.queue("work")).next()
    other = f"{names.consumer}-reclaimer"
    reclaimer = keeper(stack, connect(stack, url, other), other, SHORT_LEASE_S, reclaim=True)
    # When another consumer renews (and reclaims) between each of the holder's renewals
    for _ in range(WATCHED_RENEWALS):
        wait_for_renewal(r, names.consumer)
        reclaimer.renew_once()
        # Then the holder keeps its message
        assert tags(r, inflight(names.consumer, names.work)) == [message.delivery_tag]
    assert reclaimer.reclaimed_count == 0 and r.llen(names.work) == 0
    # When the holder stops renewing (as if dead)
    holder.stop(retire=False)
    # Then the same reclaimer puts its message back
    wait_until(
        lambda: reclaimer.renew_once() == 1 or r.llen(names.work) == 1,
        "the dead holder's message came back",
    )
    assert tags(r, names.work) == [message.delivery_tag]
    assert reclaimer.reclaimed_count == 1


def test_a_consumer_reclaimed_while_frozen_still_gives_back_what_it_takes_later(
    private_redis, names, stack
):
    url = private_redis.url
    r = inspector(stack, url)
    conn = connect(stack, url, names.consumer, SHORT_LEASE_S)
    holder = keeper(stack, conn, names.consumer, SHORT_LEASE_S, reclaim=False)
    declare(conn, names.queue("work"))
    taker = Taker(conn, names.queue("work"))
    # Given a consumer reclaimed by the others while it was frozen, which then
    # woke up, renewed its lease (learning that it lapsed) and took another message
    holder.renew_once()
    rc.reclaim(r, names.consumer)
    holder.renew_once()
    assert holder.lapsed()
    publish(conn, names, {"n": 1})
    message = taker.next()
    assert tags(r, inflight(names.consumer, names.work)) == [message.delivery_tag]
    # When it dies for good and a live consumer reclaims it
    other = f"{names.consumer}-reclaimer"
    reclaimer = keeper(stack, connect(stack, url, other), other, SHORT_LEASE_S, reclaim=True)
    wait_until(
        lambda: reclaimer.renew_once() >= 0 and not r.hexists(rc.REGISTRY_KEY, names.consumer),
        "the dead consumer was reclaimed",
    )
    # Then its message is back in the queue, not stranded in its in-flight list
    assert tags(r, names.work) == [message.delivery_tag]


@pytest.mark.slow
def test_a_proxy_whose_lease_lapsed_declares_its_private_queue_again(redis_url, names, stack):
    r = inspector(stack, redis_url)
    private = names.queue("private")
    proxy = px.Proxy(
        "t",
        names.exchange,
        broker=BrokerSettings(redis_url),
        options=px.ProxyOptions(
            consume=px.ConsumeOptions(lease=px.LeaseSpec(names.consumer, SHORT_LEASE_S)),
            queues=[px.QueueSpec(private.name, (PRIVATE_KEY,), private=True)],
        ),
    )
    thread = threading.Thread(target=proxy.start, daemon=True)
    thread.start()
    stack.callback(thread.join, WAIT_S)
    stack.callback(proxy.stop)
    assert proxy.wait(WAIT_S)
    wait_until(
        lambda: r.sismember(f"{rc.CONSUMER_PREFIX}{names.consumer}.private", private.name),
        "the proxy registered its private queue",
    )
    # Given a live proxy reclaimed by the others (as if it had been frozen)
    bound_before = bound_to(r, names.exchange, private.name)
    assert bound_before
    rc.reclaim(r, names.consumer)
    assert bound_to(r, names.exchange, private.name) == []
    # When its lease keeper renews next, learning the lease had lapsed
    # Then the proxy consumes again, with its private queue bound again
    wait_until(
        lambda: proxy.reconnect_count >= 1 and proxy.wait(0),
        "the proxy reconnected",
        timeout=3 * WAIT_S,
    )
    wait_until(
        lambda: bound_to(r, names.exchange, private.name) == bound_before,
        "the private queue was bound again",
    )
    assert r.hexists(rc.REGISTRY_KEY, names.consumer)


def test_a_lease_keeper_leaves_its_template_connection_to_the_callers_thread(
    redis_url, names, stack, monkeypatch
):
    r = inspector(stack, redis_url)
    made_by: list[tuple[kombu.Connection, threading.Thread]] = []
    real_create = kombu.Connection.create_transport

    def create_transport(self: kombu.Connection) -> Any:
        made_by.append((self, threading.current_thread()))
        return real_create(self)

    monkeypatch.setattr(kombu.Connection, "create_transport", create_transport)
    # Given a connection its owner has not used yet, handed to a lease keeper
    conn = kombu.Connection(
        redis_url,
        transport=OURS,
        transport_options={rc.CONSUMER_OPTION: names.consumer, rc.LEASE_OPTION: LONG_LEASE_S},
    )
    stack.callback(conn.release)
    lease = leases.LeaseKeeper(conn, names.consumer, LONG_LEASE_S, reclaim=False)
    stack.callback(lease.stop, retire=True)
    # When the keeper has renewed once from its thread
    lease.start()
    wait_until(lambda: r.exists(rc.lease_key(names.consumer)) == 1, "the keeper renewed")
    # Then it never set up the owner's connection from its own thread (where
    # it would race with the owner's first use of it)
    assert [t.name for c, t in made_by if c is conn and t is not threading.current_thread()] == []


# --- 7. a worker never runs a request it could not settle ---


#: Header marking the request whose message is given away under the worker.
SABOTAGE = "x-test-given-away"

#: Labels the Mark task ran with (in this process's worker).
MARKS: list[str] = []


class Mark(task.Task):
    """Records that it ran (the side effect a request must not have twice)."""

    def execute(self, label):
        MARKS.append(label)
        return label


@pytest.mark.parametrize("attempt", [1, None], ids=["pending-reply", "plain-ack"])
def test_a_worker_does_not_run_a_request_whose_message_was_given_away(
    redis_url, names, stack, monkeypatch, caplog, attempt
):
    r = inspector(stack, redis_url)
    MARKS.clear()
    thief = f"{names.exchange}.given-to-another-consumer"
    real_settle = rc.settle

    def settle(
        client: Any, held_in: str, raw: bytes, tag: str, nonce: str, pushes: list, queue: str = ""
    ) -> bool:
        if SABOTAGE.encode() in raw and not r.exists(thief):
            # The worker's lease lapsed before it settled: the message went
            # back and another consumer took it.
            with r.pipeline() as pipe:
                pipe.lrem(held_in, 1, raw).lpush(thief, raw).execute()
        return real_settle(client, held_in, raw, tag, nonce, pushes, queue)

    monkeypatch.setattr(rc, "settle", settle)
    stack.callback(r.delete, thief)
    headers = {} if attempt is None else {pr.HEADER_ATTEMPT: attempt}
    # Given a worker on Redis, and a request whose message another consumer
    # is given while the worker holds it (before it settles it)
    with (
        Client(names.exchange, url=redis_url) as client,
        running_worker(names.exchange, "marks", [Mark], threads_count=1, url=redis_url),
        caplog.at_level(logging.WARNING),
    ):
        # When that request and then another are sent, and the other is
        # answered (so the worker's loop is done with the first)
        lost = client.request(
            Mark(),
            arguments={"label": "take-away"},
            routing_key="marks",
            headers={**headers, SABOTAGE: 1},
        )
        later = client.request(
            Mark(), arguments={"label": "later"}, routing_key="marks", headers=headers
        )
        assert client.final(later)["state"] == pr.SUCCESS
    # Then the first request never ran there and was not answered, a WARNING
    # names it, and its message is with the consumer that was given it
    assert MARKS == ["later"]
    assert client.states(lost) == []
    warnings = [
        rec.getMessage()
        for rec in caplog.records
        if rec.levelno == logging.WARNING and lost in rec.getMessage()
    ]
    assert any("not run" in w for w in warnings), warnings
    [given_away] = r.lrange(thief, 0, -1)
    assert json.loads(given_away)["properties"]["correlation_id"] == lost


def test_a_channel_keeps_one_client_per_connection_pool(redis_url, stack):
    # kombu would build a redis-py client for every command (its setup costs
    # more CPU than the command); ours borrows a pooled connection per command
    # through one client, and makes a new one only for a new pool.
    channel = connect(stack, redis_url).default_channel
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second and first.connection_pool is channel.async_pool
        assert first.ping() and second.ping()
    given = redis.Redis.from_url(redis_url)
    stack.callback(given.close)
    with channel.conn_or_acquire(given) as client:
        assert client is given
    channel._async_pool = None  # as kombu does when it drops its pools
    with channel.conn_or_acquire() as third:
        assert third is not first and third.connection_pool is channel.async_pool
        assert third.ping()


def test_a_channels_clients_are_made_and_read_without_kombus_process_wide_lock(redis_url, stack):
    # kombu's cached_property takes one lock shared by every channel of the
    # process on each read; hundreds of polling threads (an engine per
    # concurrent run) queued on it. With that lock held by another thread, a
    # channel still reads its clients and polls, and a new one opens (it
    # makes its client then).
    channel = connect(stack, redis_url).default_channel
    fresh = connect(stack, redis_url)
    client, subclient = channel.client, channel.subclient  # cached now
    locks = [kombu_redis.Channel.__dict__[name].lock for name in ("client", "subclient")]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with locks[0], locks[1]:
            holding.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert holding.wait(WAIT_S)
        read: list[Any] = []
        reader = threading.Thread(
            target=lambda: read.extend(
                [channel.client, channel.subclient, fresh.default_channel.client.ping()]
            ),
            daemon=True,
        )
        reader.start()
        reader.join(WAIT_S)
        assert read == [client, subclient, True], "a read waited on kombu's lock"
    finally:
        release.set()
        holder.join(WAIT_S)


def test_a_channel_declares_and_consumes_over_the_connection_it_opened_with(private_redis, stack):
    # kombu opens a channel with a PING through the pool consuming takes its
    # connection from, and sent every other command through a second pool:
    # two connections per channel before it consumed anything. Ours borrow
    # the first while consuming does not hold it.
    watcher = inspector(stack, private_redis.url)
    opened = redis_stats.connections_received(watcher)  # this server is the test's own
    conn = connect(stack, private_redis.url)
    exchange = kombu.Exchange("x", type="direct")
    queue = kombu.Queue("q", exchange, routing_key="k")
    queue(conn.default_channel).declare()
    kombu.Producer(conn.default_channel).publish({"n": 1}, exchange=exchange, routing_key="k")
    got: list[Any] = []
    with kombu.Consumer(
        conn.default_channel,
        [queue],
        accept=["json"],
        callbacks=[lambda body, message: got.append((body, message))],
    ):
        conn.drain_events(timeout=WAIT_S)
        # Then declaring, binding, publishing and consuming took one connection
        assert redis_stats.connections_received(watcher) == opened + 1
        # and a command sent while consuming holds it gets one of its own
        [(body, message)] = got
        message.ack()
        assert body == {"n": 1} and redis_stats.connections_received(watcher) == opened + 2
    assert watcher.llen("q") == 0


def test_connections_name_flowengine_without_reading_package_metadata(
    redis_url, stack, monkeypatch
):
    # redis-py versions with DriverInfo read their own version from the
    # package's metadata for every connection they are not told it for: a
    # millisecond each, several per engine start. Ours tell it, once.
    driver = redis_identity.connection_kwargs().get("driver_info")
    if driver is None:
        pytest.skip(f"redis-py {redis.__version__} has no DriverInfo (reads its version once)")
    assert driver.lib_version == redis.__version__
    assert driver.formatted_name == f"redis-py(flowengine_v{flowengine.__version__})"
    looked_up: list[str] = []
    real_lookup = redis.utils.get_lib_version
    monkeypatch.setattr(
        redis.utils, "get_lib_version", lambda: looked_up.append("lookup") or real_lookup()
    )
    channel = connect(stack, redis_url).default_channel  # the asynchronous pool pings
    with channel.conn_or_acquire() as client:  # the pool commands go through
        assert client.ping()
    assert looked_up == []
    for pool in (channel.pool, channel.async_pool):
        assert pool.connection_kwargs["driver_info"] is driver


def test_connections_speak_resp2_and_skip_the_resp3_handshake(redis_url, stack):
    # redis-py 8 speaks RESP3 unless told otherwise: HELLO and a handshake
    # for maintenance notifications before every new connection's first
    # command, two round trips times the five connections an engine's run()
    # opens. Ours ask for RESP2 (all redis-py versions that know protocols).
    if int(redis.__version__.split(".")[0]) < 5:
        pytest.skip(f"redis-py {redis.__version__} speaks RESP2 only")
    watcher = inspector(stack, redis_url)
    hello_before = redis_stats.command_calls(watcher, "hello")
    channel = connect(stack, redis_url).default_channel  # the asynchronous pool pings
    with channel.conn_or_acquire() as client:
        assert client.ping()
    for pool in (channel.pool, channel.async_pool):
        assert pool.connection_kwargs["protocol"] == 2
    # Then neither pool's new connection said HELLO (the watcher's own said it before)
    assert redis_stats.command_calls(watcher, "hello") == hello_before
