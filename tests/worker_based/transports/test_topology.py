"""Durable vs transient declarations, typed broker errors, Redis restart recovery."""

from __future__ import annotations

import kombu
import pytest

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.publisher import Publisher
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import recovery, topology
from tests.worker_based.executor_helpers import unique


def test_transient_topology_is_taskflow_like():
    ex = topology.make_exchange("e")
    queue = topology.make_queue("q", ex, ("a", "b"), auto_delete=True)
    assert not ex.durable and not queue.durable and queue.auto_delete
    assert sorted(b.routing_key for b in queue.bindings) == ["a", "b"]
    assert topology.publish_properties(False) == {}


def test_durable_topology_keeps_everything_and_expires_private_queues():
    ex = topology.make_exchange("e", durable=True)
    shared = topology.make_queue("q", ex, ("a",), durable=True)
    private = topology.make_queue("p", ex, ("a.w",), auto_delete=True, durable=True)
    assert ex.durable and shared.durable and not shared.auto_delete
    # Durable + auto-delete would vanish in the restart it should survive
    assert private.durable and not private.auto_delete
    assert private.queue_arguments == {"x-expires": int(topology.IDLE_QUEUE_EXPIRES_S * 1000)}
    assert topology.publish_properties(True) == {"delivery_mode": 2}


def test_a_transient_queue_that_outlives_its_connection_expires_instead():
    ex = topology.make_exchange("e")
    kept = topology.make_queue("r", ex, ("a",), auto_delete=True, outlives_connection=True)
    assert not kept.durable and not kept.auto_delete
    assert kept.queue_arguments == {"x-expires": int(topology.RECONNECT_GRACE_S * 1000)}
    # Durable queues keep their own, longer expiry; shared queues are untouched
    durable = topology.make_queue(
        "r", ex, ("a",), auto_delete=True, durable=True, outlives_connection=True
    )
    assert durable.queue_arguments == {"x-expires": int(topology.IDLE_QUEUE_EXPIRES_S * 1000)}
    shared = topology.make_queue("q", ex, ("a",), outlives_connection=True)
    assert not shared.auto_delete and not shared.queue_arguments


def test_broker_errors_say_whether_to_retry():
    assert issubclass(exc.PublishTimeout, exc.BrokerUnavailable)
    assert issubclass(exc.BrokerUnavailable, exc.RecoverableError)
    assert issubclass(exc.BrokerUnavailable, exc.ExecutionFailure)
    assert not issubclass(exc.UnverifiedMessage, exc.RecoverableError)


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_publish_to_a_dead_broker_ends_in_publish_timeout_within_its_bound():
    # Given a broker port nobody listens on
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proxy = px.Proxy(
        "t",
        unique(),
        broker=BrokerSettings(f"redis://127.0.0.1:{port}/0"),
        options=px.ProxyOptions(publish_timeout_s=0.3),
    )
    # When publishing, Then a typed, recoverable error (not a hang, not kombu's)
    with pytest.raises(exc.PublishTimeout, match="broker unreachable"):
        proxy.publish(pr.Notify(), "t")


def test_durable_publisher_on_amqp_asks_for_publisher_confirms():
    url = "amqp://guest:guest@127.0.0.1:1//"
    exchange = topology.make_exchange(unique(), durable=True)
    durable = Publisher(BrokerSettings(url, durable=True), exchange)
    assert durable.connection.transport_options.get("confirm_publish") is True
    transient = Publisher(BrokerSettings(url), exchange)
    assert "confirm_publish" not in transient.connection.transport_options
    assert px.Proxy("t", unique(), broker=BrokerSettings(url, durable=True)).durable


def test_restore_stranded_is_a_no_op_off_redis():
    with kombu.Connection("memory://localhost") as conn:
        assert recovery.broker_run_id(conn) is None
        assert recovery.restore_stranded(conn, "any") == 0


@pytest.mark.broker
def test_restore_stranded_puts_back_only_what_predates_a_restart(persistent_redis):
    # Given a message delivered (parked in 'unacked') and never acknowledged
    broker = persistent_redis
    name = unique()
    ex = topology.make_exchange(name, durable=True)
    queue = topology.make_queue(name, ex, ("k",), durable=True)
    crashed = kombu.Connection(broker.url)
    bound = queue(crashed.default_channel)
    bound.declare()
    kombu.Producer(crashed.default_channel, exchange=ex).publish({"n": 1}, routing_key="k")
    assert bound.get(no_ack=False) is not None  # taken, not acked
    with kombu.Connection(broker.url) as conn:
        run_id = recovery.broker_run_id(conn)
        # When Redis did not restart, nothing is touched
        assert run_id and recovery.restore_stranded(conn, run_id) == 0
    # When Redis dies with the message parked (its consumer never closes
    # cleanly: that would put it back itself) and comes back with its data
    broker.restart()
    # ...and a consumer of the new run (it stamps the run on connecting)
    # has taken a message of its own before anyone put back the old one
    live = kombu.Connection(broker.url)
    assert recovery.broker_run_id(live) not in (None, run_id)
    kombu.Producer(live.default_channel, exchange=ex).publish({"n": 2}, routing_key="k")
    taken = queue(live.default_channel).get(no_ack=False)
    assert taken is not None and taken.payload == {"n": 2}
    with kombu.Connection(broker.url) as conn:
        assert recovery.broker_run_id(conn) != run_id
        # Then only the message parked before the restart is put back
        assert recovery.restore_stranded(conn, run_id) == 1
        message = queue(conn.default_channel).get(no_ack=True)
        assert message is not None and message.payload == {"n": 1}
        assert queue(conn.default_channel).get(no_ack=True) is None
    taken.ack()
    live.release()
    # The crashed consumer's own clean-up finds nothing left to put back
    crashed.release()
    with kombu.Connection(broker.url) as conn:
        assert queue(conn.default_channel).get(no_ack=True) is None
