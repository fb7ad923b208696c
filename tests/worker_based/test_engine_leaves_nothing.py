"""An engine's reply queue goes with its engine, on every broker, even after kill -9.

A reply queue nobody reads collects every worker's announcements for ever
(one more dead queue per engine run). On AMQP the queue expires
(``x-expires``) a while after the dead engine's connection dropped; on Redis and
the filesystem transport it is a *private* queue, deleted by any live
flowengine consumer once the engine's lease lapses (or its pid is gone).
A control client's reply queue (``flowengine inspect``/``control``) goes
with the client's stop() the same way.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import uuid
from typing import Any

import amqp
import amqp.exceptions
import kombu
import pytest
import redis

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging.control_client import ControlClient
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from tests import waiting
from tests.worker_based import executor_tasks as et
from tests.worker_based.executor_helpers import running_executor, running_worker, unique

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_child.py")

#: Bound on the clean-up after a kill: two Redis leases of the engine (6 s
#: each) plus slack for a loaded machine. A hang fails, nothing is timed.
GONE_WITHIN_S = 40.0
START_TIMEOUT_S = 60.0


#: tests.waiting.wait_until on the broker's state (there is no event to wait on).
_wait_until = functools.partial(waiting.wait_until, timeout=GONE_WITHIN_S, poll_s=0.2)


def _redis_has(url: str, exchange: str, queue: str) -> bool:
    client = redis.Redis.from_url(url)
    members = client.smembers(f"_kombu.binding.{exchange}")
    return any(m.decode().endswith(queue) for m in members)


def _amqp_has(url: str, queue: str) -> bool:
    with kombu.Connection(url) as conn:
        try:
            conn.default_channel.queue_declare(queue, passive=True)
        except amqp.exceptions.NotFound:
            return False
    return True


def _amqp_routes_to(url: str, queue: str) -> bool:
    """Whether RabbitMQ routes a message to ``queue`` (by its name, the default exchange).

    Unlike a passive declare, a publish does not renew an expiring
    queue's lease. The broker returns an unroutable mandatory message
    before it confirms it.
    """
    returned: list[Any] = []
    with kombu.Connection(url, transport_options={"confirm_publish": True}) as conn:
        channel: Any = conn.channel()
        channel.events["basic_return"].add(lambda *args: returned.append(args))
        channel.basic_publish(
            amqp.Message(b"probe"), exchange="", routing_key=queue, mandatory=True
        )
    return not returned


def _filesystem_has(folder: str, exchange: str, queue: str) -> bool:
    table = os.path.join(folder, "control", f"{exchange}.exchange")
    with open(table, encoding="utf-8") as fh:
        entries = json.loads(fh.read() or "[]")
    return any(entry[2] == queue for entry in entries)


@pytest.fixture(params=["redis", "amqp", "filesystem"])
def reply_broker(request, tmp_path):
    """(connection kwargs, has(exchange, queue)) for each broker."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return {"url": url}, lambda ex, q: _redis_has(url, ex, q)
    if request.param == "amqp":
        url = request.getfixturevalue("amqp_url")
        return {"url": url}, lambda ex, q: _amqp_has(url, q)
    conn = {"transport": "filesystem", "transport_options": {"data_folder": str(tmp_path)}}
    return conn, lambda ex, q: _filesystem_has(str(tmp_path), ex, q)


@pytest.mark.broker
def test_a_killed_engines_reply_queue_is_deleted(reply_broker):
    conn, has = reply_broker
    exchange, engine_uuid = unique(), uuid.uuid4().hex
    queue = pr.reply_queue_name(exchange, engine_uuid)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    # Given a live worker on the exchange and an engine process consuming its replies
    with running_worker(exchange, "t", [et.Echo], **conn):
        child = subprocess.Popen(
            [
                sys.executable,
                CHILD,
                json.dumps({**conn, "exchange": exchange, "uuid": engine_uuid}),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert child.stdout.readline().strip() == "ready"
            assert has(exchange, queue)
            # When the engine is killed with SIGKILL
            child.kill()
            child.wait(START_TIMEOUT_S)
            # Then its reply queue goes away
            if "amqp" in conn.get("url", ""):
                # (a passive declare, as in has(), would keep it alive)
                has = lambda _exchange, q: _amqp_routes_to(conn["url"], q)  # noqa: E731
            _wait_until(lambda: not has(exchange, queue), "the reply queue was deleted")
        finally:
            if child.poll() is None:
                child.kill()
            child.communicate(timeout=START_TIMEOUT_S)


@pytest.mark.broker
def test_a_stopped_engines_reply_queue_is_deleted_at_once(reply_broker):
    conn, has = reply_broker
    exchange = unique()
    with running_executor(exchange, ["t"], **conn) as executor:
        queue = pr.reply_queue_name(exchange, executor.uuid)
        assert has(exchange, queue)
    assert not has(exchange, queue)


@pytest.mark.broker
def test_a_stopped_control_clients_reply_queue_is_deleted_at_once(reply_broker):
    conn, has = reply_broker
    exchange = unique()
    # Given a control client consuming its reply queue
    with ControlClient(exchange, BrokerSettings.from_options(conn)) as client:
        assert has(exchange, client.reply_queue)
    # When it stopped, Then the queue is gone (by its lease, RabbitMQ or drop_queue)
    assert not has(exchange, client.reply_queue)
