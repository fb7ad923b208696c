"""kombu's failover URL lists on RabbitMQ: a dead node first in the list costs nothing.

``amqp://dead//;amqp://live//``: every connection of engines and workers
(consume loops, publishers, the event stream) tries each URL once per
attempt, from the one that answered last (``round-robin``) or in a random
order (``shuffle``). The 3-node cluster tests (tests/clusters/rabbitmq)
kill the node in use mid-run; these check the list on one real broker and a
port nobody listens on.
"""

from __future__ import annotations

import pytest

from flowengine import engines, states
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import failover
from flowengine.patterns import linear_flow as lf
from tests.worker_based import executor_tasks
from tests.worker_based.executor_helpers import running_worker, unique

pytestmark = pytest.mark.broker


@pytest.fixture
def dead_first(amqp_url: str) -> str:
    """A failover list whose first URL is a port where nothing listens."""
    import brokers

    dead = f"amqp://guest:guest@127.0.0.1:{brokers.free_port()}//"
    return f"{dead};{amqp_url}"


def test_a_flow_runs_when_the_first_node_of_the_list_is_down(dead_first):
    # Given a worker and an engine whose failover lists start with a dead node
    exchange = unique()
    flow = lf.Flow("f").add(executor_tasks.Echo("echo", inject={"value": 7}))
    with running_worker(exchange, "t", [executor_tasks.Echo], url=dead_first):
        # When the flow runs
        engine = engines.load(
            flow,
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            url=dead_first,
            transition_timeout=30,
        )
        engine.run()
    # Then it ran on the live node
    assert engine.storage.get_flow_state() == states.SUCCESS


@pytest.mark.parametrize("strategy", ["round-robin", "shuffle"])
def test_each_attempt_tries_every_url_and_remembers_the_one_that_answered(
    dead_first, amqp_url, strategy
):
    broker = BrokerSettings(dead_first, failover_strategy=strategy)
    live_port = BrokerSettings(amqp_url).connection().port
    nodes = failover.Failover(broker.connection())
    assert nodes.size == 2
    for _ in range(3):
        conn = nodes.connect()
        try:
            # Every attempt ends on the live node, whatever the order
            assert conn.connected and conn.port == live_port
            # ...through flowengine's transport, not kombu's (its own switching
            # re-reads the scheme)
            assert type(conn.transport).__module__.startswith("flowengine.")
        finally:
            conn.release()


def test_an_unknown_failover_strategy_is_refused():
    with pytest.raises(ValueError, match="failover_strategy"):
        BrokerSettings("amqp://h1//;amqp://h2//", failover_strategy="random")


def test_the_broker_is_shown_as_every_node_without_passwords():
    broker = BrokerSettings("amqp://app:s3cret@h1:5672/prod;amqp://app:s3cret@h2:5672/prod")
    assert broker.public_uri == "amqp://app:**@h1:5672/prod;amqp://app:**@h2:5672/prod"
    assert "s3cret" not in repr(broker)
