"""``flowengine queues`` and ``flowengine purge`` on Redis and RabbitMQ."""

from __future__ import annotations

import json

from kombu import Connection

from flowengine.engines.worker_based.messaging import compat
from flowengine.engines.worker_based.transports import topology
from tests.ops.helpers import WAIT_S, broker_args, flowengine, worker_process


def _fill(url: str, exchange: str, topic: str, count: int) -> str:
    """Declare ``<exchange>_<topic>`` (no worker consumes it) and put ``count`` messages in."""
    ex = compat.make_exchange(exchange, durable=False, compat=None)
    name = f"{exchange}_{topic}"
    queue = topology.make_queue(name, ex, (topic,), auto_delete=False, durable=False)
    with Connection(url) as conn:
        producer = conn.Producer()
        queue(conn.default_channel).declare()
        for i in range(count):
            producer.publish({"n": i}, exchange=ex, routing_key=topic, serializer="json")
    return name


def _queues(url: str, exchange: str, *extra: str) -> dict[str, dict]:
    proc = flowengine("queues", *broker_args(url, exchange), "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return {q["name"]: q for q in json.loads(proc.stdout)}


def test_queues_lists_depths_and_consumers_and_purge_empties_one(real_broker, exchange):
    # Given a worker on topic 'ops' and three messages waiting on a topic nobody serves
    with worker_process(real_broker, exchange) as worker:
        idle = _fill(real_broker, exchange, "idle", 3)
        # When the queues are listed
        queues = _queues(real_broker, exchange, "--queue", idle, "--timeout", "2")
        # Then the worker's queues show it as their consumer, and the idle one its depth
        ops = queues[f"{exchange}_ops"]
        assert ops["consumers"] == 1 and ops["messages"] == 0 and ops["kind"] == "topic"
        assert queues[idle]["messages"] == 3 and queues[idle]["consumers"] == 0
        private = [q for q in queues.values() if q["kind"].startswith("private to")]
        control = [q for q in queues.values() if q["kind"].startswith("control of")]
        assert len(private) == 1 and len(control) == 1
        table = flowengine("queues", *broker_args(real_broker, exchange), "--queue", idle)
        assert idle in table.stdout and "MESSAGES" in table.stdout
        # When a purge is declined, nothing goes
        declined = flowengine("purge", idle, *broker_args(real_broker, exchange), stdin="n\n")
        assert declined.returncode == 1
        assert f"Purge 3 message(s) waiting in queue {idle!r}" in declined.stderr
        assert _queues(real_broker, exchange, "--queue", idle)[idle]["messages"] == 3
        # When confirmed, the messages go and the queue stays
        done = flowengine("purge", idle, *broker_args(real_broker, exchange), "--yes")
        assert done.returncode == 0, done.stderr
        assert f"Purged 3 message(s) from queue {idle!r}." in done.stdout
        assert _queues(real_broker, exchange, "--queue", idle)[idle]["messages"] == 0
        assert worker.poll() is None


def test_purge_of_a_missing_queue_is_refused(real_broker, exchange):
    proc = flowengine(
        "purge", "no-such-queue", *broker_args(real_broker, exchange), "--yes", timeout=WAIT_S
    )
    assert proc.returncode == 2
    assert "no queue 'no-such-queue'" in proc.stderr
