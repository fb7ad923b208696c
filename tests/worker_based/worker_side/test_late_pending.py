"""A late PENDING: the reply a worker spares when its engine allows it (header ``late_pending``).

Given a flowengine engine's request carrying ``late_pending``, a worker
acknowledges it without a PENDING reply: a request answered within
RUNNING_REPLY_DELAY_S of being taken costs its outcome only; one still held
then is told (PENDING while it waits for a thread, RUNNING once it runs),
naming its holder as before. Without the header, PENDING goes out with the
acknowledgement, as always.
"""

from __future__ import annotations

import uuid

import pytest
import worker_tasks as wt
from test_replier import KEY, _hold, _sent_before_marker, replier_and_client
from wire_helpers import Client, running_worker

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import names
from flowengine.engines.worker_based.worker_side import replier as replier_mod
from tests.worker_based.executor_helpers import running_executor, wait_workers

TOPIC = "t"
#: Bound (s) on waits, only so that a bug fails the test instead of hanging it.
WAIT_S = 30.0
MEMORY = {"transport": "memory"}
LATE = {pr.HEADER_ATTEMPT: 0, names.HEADER_LATE_PENDING: True}


def test_a_request_answered_at_once_gets_its_outcome_only(monkeypatch):
    # "At once": well within the delay, however loaded the machine.
    monkeypatch.setattr(replier_mod, "RUNNING_REPLY_DELAY_S", 30.0)
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    with (
        Client(exchange, **MEMORY) as client,
        running_worker(exchange, TOPIC, [wt.Add], **MEMORY),
    ):
        late = client.request(wt.Add(), arguments={"x": 1, "y": 2}, routing_key=TOPIC, headers=LATE)
        usual = client.request(
            wt.Add(), arguments={"x": 1, "y": 2}, routing_key=TOPIC, headers={pr.HEADER_ATTEMPT: 0}
        )
        for cid in (late, usual):
            assert client.final(cid) == {"state": pr.SUCCESS, "data": {"result": 3}}
    # Replies of one worker arrive in the order it sent them: a PENDING sent
    # with the acknowledgement would come before the outcome.
    assert client.states(late)[0] == pr.SUCCESS
    assert client.states(usual)[0] == pr.PENDING


def test_a_request_still_held_later_is_told_with_its_holder():
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    wt.STARTED.clear()
    wt.RELEASE.clear()
    try:
        with (
            Client(exchange, **MEMORY) as client,
            running_worker(exchange, TOPIC, [wt.Blocking], **MEMORY) as worker,
        ):
            held = client.request(wt.Blocking(), routing_key=TOPIC, headers=LATE)
            assert wt.STARTED.wait(10)
            # While it runs, its engine hears who holds it (from the heartbeat thread)
            assert client.wait_for(lambda: pr.RUNNING in client.states(held))
            wt.RELEASE.set()
            assert client.final(held)["state"] == pr.SUCCESS
        _data, headers = client.responses[held][0]
        assert headers[pr.HEADER_WORKER_ID] == worker.worker_id
    finally:
        wt.RELEASE.set()


def test_a_late_reply_tells_the_state_of_a_request_still_held_and_nothing_once_answered():
    with replier_and_client() as (replier, memory, client):
        # Given a request taken without PENDING, still waiting for a thread
        entry = _hold(memory, client)
        replier._send_due([entry])  # its late reply is due
        assert _sent_before_marker(replier, client, "u-1") == [pr.PENDING]
        # When it runs, then is answered before its next late reply is due
        memory.start(KEY)
        replier._send_due([entry])
        replier.answering(entry, {"state": pr.SUCCESS, "data": {"result": 1}})
        replier._send_due([entry])
        # Then that reply is not sent: nothing follows an outcome
        assert _sent_before_marker(replier, client, "u-1") == [pr.PENDING, pr.RUNNING]


def test_an_engine_asks_for_a_late_pending_only_when_told():
    from flowengine.engines.worker_based.executor_side.executor import _policy_headers
    from flowengine.engines.worker_based.executor_side.policy import RequestPolicy

    assert _policy_headers(RequestPolicy(late_pending=True))[names.HEADER_LATE_PENDING] is True
    # None (the default) is decided per request, by who may take it (discovery)
    assert RequestPolicy().late_pending is None
    for unsaid in (RequestPolicy(), RequestPolicy(late_pending=False)):
        assert names.HEADER_LATE_PENDING not in _policy_headers(unsaid)
    with pytest.raises(ValueError, match="late_pending must be True, False or None"):
        RequestPolicy.from_options({"late_pending": "yes"})


@pytest.mark.parametrize("transport", ["amqp", "memory"])
def test_workers_say_they_settle_late_requests_after_run_only_on_rabbitmq(request, transport):
    # RabbitMQ gives an unacknowledged message back when its consumer goes;
    # the other transports do not (so late requests are acknowledged on taking).
    conn = {"url": request.getfixturevalue("amqp_url")} if transport == "amqp" else MEMORY
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    with (
        running_worker(exchange, TOPIC, [wt.Add], **conn) as worker,
        running_executor(exchange, [TOPIC], **conn) as executor,
    ):
        assert wait_workers(executor, lambda finder: finder.total_workers == 1)
        assert executor.finder.settles_after_run(TOPIC) is (transport == "amqp")
        assert executor.finder.workers[0].worker_id == worker.worker_id


@pytest.mark.parametrize(("policy", "asks"), [(None, True), (False, False), (True, True)])
def test_an_engine_left_to_decide_asks_for_a_late_pending_where_workers_settle(
    amqp_url, policy, asks
):
    # Given a worker on RabbitMQ (it settles late requests after run) and an
    # engine with late_pending left to it (None), refused or asked for
    exchange = f"fe-test-{uuid.uuid4().hex[:12]}"
    seen: list[dict] = []
    with (
        running_worker(exchange, TOPIC, [wt.Add], url=amqp_url),
        running_executor(exchange, [TOPIC], url=amqp_url, late_pending=policy) as executor,
    ):
        assert wait_workers(executor, lambda finder: finder.total_workers == 1)
        prepare = executor._proxy.prepare

        def recording(msg, routing_key, **kwargs):
            seen.append(dict(kwargs.get("headers") or {}))
            return prepare(msg, routing_key, **kwargs)

        executor._proxy.prepare = recording  # every request is prepared, then sent
        # When it runs a task there
        future = executor.execute_task(wt.Add(), "u-1", {"x": 1, "y": 2})
        assert future.result(WAIT_S)[1] == 3
    # Then its request asked for a late PENDING as the policy says
    assert seen and all(pr.HEADER_ATTEMPT in headers for headers in seen)
    assert all(bool(headers.get(names.HEADER_LATE_PENDING)) is asks for headers in seen)
