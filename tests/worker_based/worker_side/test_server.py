"""Server (through a Worker): replies, events, announcements, bad input of every kind."""

from __future__ import annotations

import json
import logging
import random
import threading
import time

import pytest
import worker_tasks as wt
from wire_helpers import Client, RawSender, conn_kwargs, running_worker

from flowengine.engines.worker_based import protocol as pr
from flowengine.types import failure as ft

TOPIC = "calc"


@pytest.fixture
def served(broker, unique_name):
    """A worker serving worker_tasks on TOPIC and a client, both on ``broker``."""
    conn = conn_kwargs(broker)
    with (
        Client(unique_name, **conn) as client,
        running_worker(unique_name, TOPIC, ["worker_tasks"], threads_count=2, **conn) as worker,
    ):
        yield client, worker


def test_execute_replies_running_then_success(served):
    client, worker = served
    cid = client.request(wt.Add(), arguments={"x": 40, "y": 2}, routing_key=TOPIC)
    assert client.final(cid) == {"state": "SUCCESS", "data": {"result": 42}}
    assert client.states(cid) == ["RUNNING", "SUCCESS"]
    _data, headers = client.responses[cid][-1]
    assert headers[pr.HEADER_WORKER_ID] == worker.worker_id
    assert headers[pr.HEADER_ORIGIN].count(":") == 1


def test_task_failure_is_a_valid_failure_reply(served):
    client, _worker = served
    cid = client.request(wt.Fail(), routing_key=TOPIC)
    final = client.final(cid)
    assert final["state"] == "FAILURE"
    pr.Response.validate(final)
    failure = pr.Response.from_dict(final).data["result"]
    assert failure.check(RuntimeError) and failure.exception_str == "Woot!"


def test_revert_gets_result_and_failures(served):
    client, _worker = served
    fail = ft.Failure.from_exception(RuntimeError("earlier"))
    cid = client.request(
        wt.Fail(), action=pr.REVERT, routing_key=TOPIC, result=fail, failures={"a": fail, "b": fail}
    )
    assert client.final(cid)["data"]["result"] == {"result_type": "Failure", "failures": ["a", "b"]}


def test_progress_events_arrive_in_order_before_the_result(served):
    client, _worker = served
    cid = client.request(wt.Progress(), routing_key=TOPIC)
    client.final(cid)
    responses = [d for d, _h in client.responses[cid]]
    assert [r["state"] for r in responses] == ["RUNNING", "EVENT", "EVENT", "SUCCESS"]
    assert [r["data"]["details"]["progress"] for r in responses[1:3]] == [0.5, 1.0]
    assert responses[1]["data"]["event_type"] == "update_progress"


def test_unknown_task_gets_an_unknown_task_failure(served):
    client, worker = served

    class NotServed(wt.Add):
        pass

    cid = client.request(NotServed(name="stranger"), routing_key=TOPIC)
    final = client.final(cid)
    assert final["state"] == "FAILURE"
    result = final["data"]["result"]
    assert any(n.endswith("UnknownTask") for n in result["exc_type_names"])
    assert "NotServed" in result["exception_str"] and worker.worker_id in result["exception_str"]
    assert client.states(cid) == ["FAILURE"]  # never ran


def test_unserialisable_result_becomes_a_failure_naming_it(served):
    client, _worker = served
    cid = client.request(wt.Unserialisable(), routing_key=TOPIC)
    final = client.final(cid)
    assert final["state"] == "FAILURE"
    result = final["data"]["result"]
    assert any(n.endswith("SerializationFailure") for n in result["exc_type_names"])
    assert "worker_tasks.Unserialisable" in result["exception_str"]
    assert "not JSON serializable" in result["exception_str"]


@pytest.mark.parametrize("broker", ["memory"], indirect=True)
def test_oversized_result_becomes_a_failure_naming_it(served):
    client, _worker = served
    final = client.final(client.request(wt.Huge(), routing_key=TOPIC))
    assert final["state"] == "FAILURE"
    assert "exceeds the limit" in final["data"]["result"]["exception_str"]


def test_failure_with_unserialisable_args_still_arrives(served):
    client, _worker = served
    final = client.final(client.request(wt.BadFailure(), routing_key=TOPIC))
    assert final["state"] == "FAILURE"
    assert "ValueError" in final["data"]["result"]["exc_type_names"]


def test_task_that_cannot_be_built_fails_cleanly(served):
    client, _worker = served
    final = client.final(client.request(wt.NeedsArg(1), routing_key=TOPIC))
    assert final["state"] == "FAILURE"
    assert "could not create task" in final["data"]["result"]["exception_str"]


def test_private_routing_key_reaches_that_worker(served):
    client, worker = served
    key = pr.worker_routing_key(TOPIC, worker.worker_id)
    cid = client.request(wt.Add(), arguments={"x": 1, "y": 1}, routing_key=key)
    assert client.final(cid)["data"]["result"] == 2


def test_notify_is_answered_with_topic_and_tasks(served):
    client, worker = served
    # Waited for by its correlation id: an announcement (the start one, late,
    # or a periodic one) says the same but is not the answer.
    client.proxy.publish(pr.Notify(), TOPIC, reply_to=client.uuid, correlation_id="probe")
    assert client.wait_for(lambda: client.answers("probe"))
    answer, headers = client.answers("probe")[0]
    assert headers[pr.HEADER_WORKER_ID] == worker.worker_id
    assert answer["topic"] == TOPIC
    assert "worker_tasks.Add" in answer["tasks"]
    assert "worker_tasks._Helper" not in answer["tasks"]


def test_expired_request_is_dropped_unrun(served, caplog):
    client, _worker = served
    with caplog.at_level(logging.INFO):
        stale = client.request(
            wt.Add(),
            arguments={"x": 1, "y": 1},
            routing_key=TOPIC,
            headers={pr.HEADER_EXPIRES: time.time() - 5},
        )
        fresh = client.request(
            wt.Add(),
            arguments={"x": 2, "y": 2},
            routing_key=TOPIC,
            headers={pr.HEADER_EXPIRES: time.time() + 60},
        )
        assert client.final(fresh)["data"]["result"] == 4
        # (the stale one's own outcome waited for, not inferred from the fresh one's)
        dropped = client.final(stale)
    # Dropped unrun, and said so: a FAILURE (RequestExpired), never RUNNING
    assert client.states(stale) == ["FAILURE"]
    assert "RequestExpired" in str(dropped["data"]["result"]["exc_type_names"])
    assert "expired" in caplog.text and stale in caplog.text


def test_bad_expires_header_is_a_failure(served):
    client, _worker = served
    cid = client.request(
        wt.Add(),
        arguments={"x": 1, "y": 1},
        routing_key=TOPIC,
        headers={pr.HEADER_EXPIRES: "whenever"},
    )
    assert "expires" in client.final(cid)["data"]["result"]["exception_str"]


def test_announces_on_start_and_on_leaving(broker, unique_name):
    conn = conn_kwargs(broker)
    with Client(unique_name, **conn) as client:
        with running_worker(unique_name, TOPIC, [wt.Add], **conn) as worker:
            wid = worker.worker_id
            assert client.wait_for(
                lambda: any(h.get(pr.HEADER_WORKER_ID) == wid for _d, h in client.notifies)
            )
        assert client.wait_for(lambda: any(h.get(pr.HEADER_LEAVING) for _d, h in client.notifies))
    mine = [(d, h) for d, h in client.notifies if h.get(pr.HEADER_WORKER_ID) == wid]
    assert mine[0][0] == {"topic": TOPIC, "tasks": ["worker_tasks.Add"]}
    assert not mine[0][1].get(pr.HEADER_LEAVING)
    assert mine[-1][0] == {"topic": TOPIC, "tasks": []} and mine[-1][1][pr.HEADER_LEAVING]


def test_notify_answered_while_every_thread_is_busy(broker, unique_name):
    conn = conn_kwargs(broker)
    wt.STARTED.clear()
    wt.RELEASE.clear()
    try:
        with (
            Client(unique_name, **conn) as client,
            running_worker(unique_name, TOPIC, [wt.Blocking], threads_count=1, **conn) as worker,
        ):
            busy = client.request(wt.Blocking(), routing_key=TOPIC)
            assert wt.STARTED.wait(10)
            queued = client.request(wt.Blocking(), routing_key=TOPIC)  # waits for a thread
            # The answer itself, not an announcement (those come from the
            # heartbeat thread, busy task threads or not).
            client.proxy.publish(pr.Notify(), TOPIC, reply_to=client.uuid, correlation_id="probe")
            assert client.wait_for(lambda: client.answers("probe"), timeout=5)
            assert client.answers("probe")[0][1][pr.HEADER_WORKER_ID] == worker.worker_id
            # Still busy: the first has not finished, the second has not started.
            states = (client.states(busy), client.states(queued))
            assert set(states[0]) <= {"RUNNING"} and states[1] == [], states
            wt.RELEASE.set()
            assert client.final(busy)["state"] == client.final(queued)["state"] == "SUCCESS"
    finally:
        wt.RELEASE.set()


def test_duplicate_of_a_running_request_is_not_run_twice(broker, unique_name, caplog):
    conn = conn_kwargs(broker)
    wt.STARTED.clear()
    wt.RELEASE.clear()
    try:
        with (
            Client(unique_name, **conn) as client,
            running_worker(unique_name, TOPIC, [wt.Blocking], threads_count=2, **conn) as worker,
        ):
            req = pr.Request(wt.Blocking(), "dup-1", pr.EXECUTE, {})
            client.proxy.publish(req, TOPIC, reply_to=client.uuid, correlation_id="dup-1")
            assert wt.STARTED.wait(10)
            client.proxy.publish(req, TOPIC, reply_to=client.uuid, correlation_id="dup-1")
            # An unrelated request proves the duplicate was consumed and skipped.
            probe = client.request(wt.Blocking(), routing_key=TOPIC)
            assert client.wait_for(lambda: client.states(probe) == ["RUNNING"])
            assert worker.server.running_count == 2
            wt.RELEASE.set()
            client.final(probe)
            client.final("dup-1")
            # The duplicate is answered with the state it has here, not run again
            assert client.states("dup-1") == ["RUNNING", "RUNNING", "SUCCESS"]
    finally:
        wt.RELEASE.set()
    assert "duplicate" in caplog.text.lower()


def test_running_heartbeat(served, monkeypatch):
    client, worker = served
    wt.STARTED.clear()
    wt.RELEASE.clear()
    server = worker.server
    try:
        cid = client.request(wt.Blocking(), routing_key=TOPIC)
        assert wt.STARTED.wait(10)
        assert client.wait_for(lambda: client.states(cid) == ["RUNNING"])
        assert server.send_heartbeats() == 1
        assert client.wait_for(lambda: client.states(cid) == ["RUNNING", "RUNNING"])
        wt.RELEASE.set()
        assert client.final(cid)["state"] == "SUCCESS"
    finally:
        wt.RELEASE.set()


def test_no_heartbeat_follows_an_outcome(served, monkeypatch):
    client, worker = served
    server = worker.server
    real_publish = server.proxy.publish
    beats: list[int] = []

    def publish(msg, routing_key, *args, **kwargs):
        if msg.to_dict().get("state") == pr.SUCCESS:
            # A heartbeat round just as the outcome goes out
            beat = threading.Thread(target=lambda: beats.append(server.send_heartbeats()))
            beat.start()
            beat.join(10)
        return real_publish(msg, routing_key, *args, **kwargs)

    monkeypatch.setattr(server.proxy, "publish", publish)
    # Given a request whose outcome is being sent
    cid = client.request(wt.Add(), arguments={"x": 1, "y": 2}, routing_key=TOPIC)
    assert client.final(cid)["state"] == pr.SUCCESS
    # Then the heartbeat round skipped it: nothing repeats RUNNING after the outcome
    assert beats == [0]
    assert client.states(cid) == ["RUNNING", "SUCCESS"]


def test_a_duplicate_arriving_while_the_outcome_is_sent_gets_that_outcome(served, monkeypatch):
    client, worker = served
    server = worker.server
    real_publish = server.proxy.publish
    answered_duplicate = threading.Event()
    outcomes: list[int] = []
    request = pr.Request(wt.Add(), "dup-2", pr.EXECUTE, {"x": 1, "y": 2})

    def publish(msg, routing_key, *args, **kwargs):
        if msg.to_dict().get("state") == pr.SUCCESS:
            outcomes.append(1)
            if len(outcomes) == 1:
                # Given the outcome about to go out, when a duplicate arrives now
                client.proxy.publish(request, TOPIC, reply_to=client.uuid, correlation_id="dup-2")
                answered_duplicate.wait(10)  # bounded: without an answer the test fails
            else:
                answered_duplicate.set()
        return real_publish(msg, routing_key, *args, **kwargs)

    monkeypatch.setattr(server.proxy, "publish", publish)
    client.proxy.publish(request, TOPIC, reply_to=client.uuid, correlation_id="dup-2")
    # Then the duplicate is answered with the same outcome, not left unanswered
    assert client.wait_for(lambda: client.states("dup-2").count(pr.SUCCESS) == 2)
    assert answered_duplicate.is_set()
    assert client.states("dup-2") == ["RUNNING", "SUCCESS", "SUCCESS"]


# --- a batch of bad messages, then good requests ---


def _bad_messages(rng: random.Random, topic: str, reply_to: str):
    """Yield (kind, body, properties, expects_failure_reply) for many malformed messages."""
    good = pr.Request(wt.Add(), "x", pr.EXECUTE, {"x": 1, "y": 2}).to_dict()
    fail_dict = ft.Failure.from_exception(RuntimeError("x")).to_dict()

    def mutated():
        body = json.loads(json.dumps(good))
        choice = rng.randrange(12)
        if choice == 0:
            del body[rng.choice(["task_cls", "task_name", "task_version", "action"])]
        elif choice == 1:
            body["action"] = rng.choice(["run", "", "EXECUTE", 5, None])
        elif choice == 2:
            body["task_cls"] = rng.choice([1, None, [], {"a": 1}])
        elif choice == 3:
            body["arguments"] = rng.choice([[1], "args", 3])
        elif choice == 4:
            body["task_version"] = rng.choice([1.5, None, {"v": 1}])
        elif choice == 5:
            body.update(
                action="revert",
                result=rng.choice(["x", [1], ["failure", {"exception_str": 1}], ["maybe", 2]]),
            )
        elif choice == 6:
            body.update(action="revert", failures={"a": dict(fail_dict, version=99)})
        elif choice == 7:
            body.update(action="revert", failures={"a": {"traceback_str": "t"}})
        elif choice == 8:
            body["task_cls"] = rng.choice(
                ["os.system", "subprocess.Popen", "worker_tasks._Helper", "no.such.Task"]
            )
        elif choice == 9:
            body["task_cls"] = "worker_tasks.Add"
            body["arguments"] = {"x": 1}  # wrong arguments: a task failure
        elif choice == 10:
            return [1, 2, 3]
        else:
            return rng.choice(["string", 5, None, True])
        return body

    def props(cid):
        return {"type": pr.REQUEST, "reply_to": reply_to, "correlation_id": cid}

    n, huge_left = 0, 3
    while True:
        n += 1
        cid = f"bad-{n}"
        kind = rng.randrange(10)
        if kind <= 4:
            yield "schema", json.dumps(mutated()), props(cid), True
        elif kind == 5:
            raw = json.dumps(good)
            yield "bad json", raw[: rng.randrange(1, len(raw) - 1)], props(cid), True
        elif kind == 6:
            p = props(cid)
            del p[rng.choice(["reply_to", "correlation_id"])]
            yield "missing property", json.dumps(good), p, False
        elif kind == 7:
            p = props(cid)
            p["type"] = rng.choice(["RESPONSE", "NOTIFY", "BOGUS"])
            # A NOTIFY to a worker answers with a notify, not a FAILURE;
            # RESPONSE is never answered; an unknown type gets a FAILURE.
            yield "wrong type", json.dumps(good), p, p["type"] == "BOGUS"
        elif kind == 8:
            p = props(cid)
            p["content_type"] = rng.choice(
                ["application/x-python-serialize", "application/x-yaml", "text/plain"]
            )
            yield "content type", json.dumps(good), p, True
        elif huge_left:
            huge_left -= 1  # a few are enough: each is over 8 MiB
            yield (
                "huge",
                json.dumps(dict(good, pad="h" * (pr.MAX_BODY_BYTES + 10))),
                props(cid),
                True,
            )
        else:
            yield "schema", json.dumps(mutated()), props(cid), True


@pytest.mark.slow  # 1,000 messages and their replies: a few seconds on a shared machine
@pytest.mark.parametrize("broker", ["memory", "filesystem"], indirect=True)
def test_a_thousand_bad_messages_then_good_requests(broker, unique_name, caplog):
    # Given a running worker and 1,000 malformed messages of every kind,
    conn = conn_kwargs(broker)
    rng = random.Random(20260522)
    sender = RawSender(unique_name, **conn)
    caplog.set_level(logging.WARNING)
    try:
        with (
            Client(unique_name, **conn) as client,
            running_worker(unique_name, TOPIC, ["worker_tasks"], threads_count=2, **conn) as worker,
        ):
            expected, kinds = [], {}
            for kind, body, props, answer in _bad_messages(rng, TOPIC, client.uuid):
                if sum(kinds.values()) >= 1000:
                    break
                kinds[kind] = kinds.get(kind, 0) + 1
                content_type = props.pop("content_type", "application/json")
                sender.send(body, TOPIC, content_type=content_type, **props)
                if answer:
                    expected.append(props["correlation_id"])
            # When good requests follow,
            good = [
                client.request(wt.Add(), arguments={"x": i, "y": 1}, routing_key=TOPIC)
                for i in range(20)
            ]
            # Then every good request succeeds,
            assert [client.final(cid, timeout=30)["data"]["result"] for cid in good] == [
                i + 1 for i in range(20)
            ]

            # every bad one with a reply address got a FAILURE (or, for a wrong
            # task argument, ran and failed), none got a SUCCESS. Waited for
            # until each has its outcome: one that ran says RUNNING first.
            def unfinished() -> list[tuple[str, list[str]]]:
                return [
                    (c, client.states(c))
                    for c in expected
                    if not {pr.SUCCESS, pr.FAILURE} & set(client.states(c))
                ]

            assert client.wait_for(lambda: not unfinished(), 30), unfinished()[:5]
            for cid in expected:
                states = client.states(cid)
                assert states[-1] == pr.FAILURE and pr.SUCCESS not in states, (cid, states)
            # and each rejection was logged with its reason.
            rejected = worker.server.proxy.dispatcher.rejected_count
            assert rejected >= sum(kinds.values()) - kinds.get("schema", 0)
    finally:
        sender.close()
    assert set(kinds) == {
        "schema",
        "bad json",
        "missing property",
        "wrong type",
        "content type",
        "huge",
    }
    text = caplog.text
    for needle in (
        "not of the expected format",
        "undecodable body",
        "lacks required property",
        "unexpected message type",
        "exceeds the limit",
        "does not serve",
    ):
        assert needle in text, needle
