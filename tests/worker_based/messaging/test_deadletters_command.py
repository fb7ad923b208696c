"""``flowengine deadletters list|show|requeue``, and dead-letter queues in ``queues``/``purge``.

Every broker kind. The commands run as processes of their own, except on
the memory transport (its queues live in this process): there they run
in-process on it.
"""

from __future__ import annotations

import io
import json
import sys

import kombu
import pytest
import worker_tasks as wt
from wire_helpers import WAIT_S, Client, RawSender, conn_kwargs, running_worker

from flowengine import cli
from flowengine.commands import broker_options
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging import compat, inventory
from flowengine.engines.worker_based.messaging import dead_letter_reader as dlr
from flowengine.engines.worker_based.messaging import dead_letters as dl
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import topology
from tests import waiting
from tests.ops.helpers import flowengine

TOPIC = "calc"
#: The first worker's body limit: the request padded past it is refused.
SMALL_LIMIT = 1000


class Commands:
    """Runs ``flowengine`` commands against one broker of the ``broker`` fixture."""

    def __init__(self, broker, exchange: str, monkeypatch, capsys) -> None:
        self.broker = broker
        self.exchange = exchange
        self._monkeypatch = monkeypatch
        self._capsys = capsys
        if broker.kind == "memory":  # the command's broker is this process's memory
            monkeypatch.setattr(
                broker_options, "broker_settings", lambda args, why: BrokerSettings("memory://")
            )

    def __call__(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of ``flowengine ARGS`` on the broker and exchange."""
        where = ["--exchange", self.exchange]
        if self.broker.kind == "memory":
            self._capsys.readouterr()
            self._monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
            code = cli.main([*args, *where])
            out, err = self._capsys.readouterr()
            return code, out, err
        where += ["--url", self.broker.url]
        for key, value in self.broker.transport_options.items():
            where += [
                "--transport-option",
                f"{key}={json.dumps(value)}" if not isinstance(value, str) else f"{key}={value}",
            ]
        proc = flowengine(*args, *where, stdin=stdin)
        return proc.returncode, proc.stdout, proc.stderr


def settings(broker) -> BrokerSettings:
    return BrokerSettings(broker.url, transport_options=dict(broker.transport_options))


def request_props(client: Client, cid: str) -> dict:
    return {"type": pr.REQUEST, "reply_to": client.uuid, "correlation_id": cid}


def states(client: Client, cid: str) -> list[str]:
    return client.states(cid)


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_dead_letters_are_listed_shown_requeued_once_fixed_and_purged(
    broker, unique_name, monkeypatch, capsys
):
    run = Commands(broker, unique_name, monkeypatch, capsys)
    dead = f"{unique_name}_{TOPIC}.dead"
    conn = conn_kwargs(broker)
    sender = RawSender(unique_name, **conn)
    try:
        with Client(unique_name, **conn) as client:
            # Given a worker whose body limit is too small for one request,
            # which refuses it and two messages that are not JSON,
            with running_worker(
                unique_name,
                TOPIC,
                ["worker_tasks"],
                threads_count=1,
                max_body_bytes=SMALL_LIMIT,
                **conn,
            ) as worker:
                proxy = worker.server.proxy

                def dead_lettered(count: int) -> None:
                    # One at a time: two connections publish, so only this sets their
                    # order. Polled: nothing signals the worker's count.
                    waiting.wait_until(
                        lambda: proxy.dead_lettered == {dead: count},
                        f"{count} dead letter(s)",
                        timeout=WAIT_S,
                    )

                sender.send("{not json", TOPIC, **request_props(client, "poison-1"))
                dead_lettered(1)
                big = client.request(
                    wt.Add(name="add-" + "x" * SMALL_LIMIT),
                    arguments={"x": 40, "y": 2},
                    routing_key=TOPIC,
                )
                dead_lettered(2)
                sender.send("{still not json", TOPIC, **request_props(client, "poison-2"))
                dead_lettered(3)
                assert client.final(big)["state"] == pr.FAILURE
                # `queues` lists their dead-letter queue, marked, with its depth.
                code, out, err = run("queues", "--json", "--timeout", "2")
                assert code == 0, err
                rows = {row["name"]: row for row in json.loads(out)}
                assert rows[dead]["messages"] == 3 and rows[dead]["dead_letters"] is True
                assert rows[dead]["kind"] == f"dead letters of {unique_name}_{TOPIC}"
                assert rows[f"{unique_name}_{TOPIC}"]["dead_letters"] is False
            # When they are listed: one line each, oldest first, saying why and from where,
            code, out, err = run("deadletters", "list", dead)
            assert code == 0, err
            lines = out.splitlines()
            assert lines[0].split() == [
                "#",
                "REFUSED",
                "AT",
                "(UTC)",
                "TYPE",
                "CORRELATION",
                "ID",
                "FROM",
                "QUEUE",
                "REASON",
            ]
            assert [line.split()[0] for line in lines[1:]] == ["1", "2", "3"]
            cids = [line.split()[4] for line in lines[1:]]
            assert cids == ["poison-1", big, "poison-2"]
            assert all(
                line.split()[3] == pr.REQUEST and line.split()[5] == f"{unique_name}_{TOPIC}"
                for line in lines[1:]
            )
            assert f"exceeds the limit of {SMALL_LIMIT} bytes" in lines[2]
            assert "3 dead letter(s) in queue" in err
            # and the refused request is shown whole,
            code, out, err = run("deadletters", "show", dead, "--index", "2", "--json")
            assert code == 0, err
            shown = json.loads(out)
            assert shown["reason"].startswith("body of ")
            assert (shown["exchange"], shown["routing_key"], shown["queue"]) == (
                unique_name,
                TOPIC,
                f"{unique_name}_{TOPIC}",
            )
            assert shown["properties"]["correlation_id"] == big
            assert shown["properties"]["content_type"] == "application/json"
            assert "add-xxxx" in shown["body_excerpt"] and shown["truncated_from"] is None
            # (reading took nothing away, nor changed the order)
            letters = dlr.read_dead_letters(settings(broker), unique_name, dead)
            assert [letter.correlation_id for letter in letters] == cids
            # then, the cause fixed (a worker with the default limit), requeued:
            with running_worker(unique_name, TOPIC, ["worker_tasks"], threads_count=1, **conn):
                code, out, err = run("deadletters", "requeue", dead, "--index", "2", "--yes")
                assert code == 0, err
                assert "Requeued 1 dead letter(s)" in out
                # Then it runs, answering its engine,
                assert client.wait_for(lambda: pr.SUCCESS in states(client, big), WAIT_S), states(
                    client, big
                )
            assert client.responses[big][-1][0]["data"] == {"result": 42}
    finally:
        sender.close()
    # and only the others stay, in their order;
    letters = dlr.read_dead_letters(settings(broker), unique_name, dead)
    assert [letter.correlation_id for letter in letters] == ["poison-1", "poison-2"]
    # `purge` empties the dead-letter queue.
    code, out, err = run("purge", dead, "--yes")
    assert code == 0, err
    assert f"Purged 2 message(s) from queue {dead!r}." in out
    assert dlr.read_dead_letters(settings(broker), unique_name, dead) == []


def _put_dead_letter(
    conn: kombu.Connection,
    exchange: kombu.Exchange,
    dead: str,
    routing_key: str,
    cid: str,
    *,
    truncated: int | None = None,
) -> None:
    """A dead letter as a consume loop writes it, for a message sent with ``routing_key``."""
    headers = {
        dl.HEADER_REASON: "refused for the test",
        dl.HEADER_QUEUE: f"{exchange.name}_x",
        dl.HEADER_EXCHANGE: exchange.name,
        dl.HEADER_ROUTING_KEY: routing_key,
        dl.HEADER_AT: 1_700_000_000.25,
        dl.HEADER_BY: "test",
        dl.HEADER_PROPERTIES: json.dumps(
            {
                "type": pr.REQUEST,
                "correlation_id": cid,
                "reply_to": "nobody",
                "content_type": "application/json",
                "content_encoding": "utf-8",
            }
        ),
        dl.HEADER_HEADERS: json.dumps({"attempt": 1, "trace": "t-1"}),
    }
    if truncated is not None:
        headers[dl.HEADER_TRUNCATED] = truncated
    channel = conn.channel()
    dl.declare_queue(channel, exchange, dead, durable=False)
    kombu.Producer(channel, exchange=exchange, auto_declare=False).publish(
        b'{"cid": "%s"}' % cid.encode(),
        routing_key=dead,
        headers=headers,
        content_type="application/octet-stream",
        content_encoding="binary",
    )


def test_requeue_sends_a_message_back_as_it_was_and_keeps_what_it_cannot_send(broker, unique_name):
    # Given a dead letter for a bound routing key, one whose body was cut,
    # and one for a routing key nothing is bound to,
    exchange = compat.make_exchange(unique_name)
    dead = f"{unique_name}_x.dead"
    target = topology.make_queue(f"{unique_name}_target", exchange, ("target",))
    conn = kombu.Connection(
        broker.url,
        transport=transports.resolve(broker.url, None),
        transport_options=dict(broker.transport_options),
    )
    try:
        target(conn.channel()).declare()
        _put_dead_letter(conn, exchange, dead, "target", "ok-1")
        _put_dead_letter(conn, exchange, dead, "target", "cut", truncated=10**6)
        _put_dead_letter(conn, exchange, dead, "target", "ok-2")
        _put_dead_letter(conn, exchange, dead, "nobody-listens", "lost")
        # when all are requeued,
        report = dlr.requeue_dead_letters(settings(broker), unique_name, dead)
        # those that could go went, in order, as they were first published,
        assert [letter.correlation_id for letter in report.requeued] == ["ok-1", "ok-2"]
        bound = target(conn.channel())
        arrived = []
        while (message := bound.get(no_ack=True)) is not None:
            arrived.append(message)
        assert [m.properties["correlation_id"] for m in arrived] == ["ok-1", "ok-2"]
        first = arrived[0]
        body = first.body if isinstance(first.body, bytes) else first.body.encode()  # py-amqp
        assert body == b'{"cid": "ok-1"}' and first.decode() == {"cid": "ok-1"}
        assert first.properties["type"] == pr.REQUEST
        assert first.properties["reply_to"] == "nobody"
        assert (first.content_type, first.content_encoding) == ("application/json", "utf-8")
        assert {k: first.headers[k] for k in ("attempt", "trace")} == {"attempt": 1, "trace": "t-1"}
        assert not any(k.startswith("x-dead-") for k in first.headers)
        # and the others stay in the dead-letter queue, each kept saying why.
        kept = {letter.correlation_id: why for letter, why in report.kept}
        assert "body was cut" in kept["cut"]
        if broker.kind == "amqp":
            assert "NO_ROUTE" in kept["lost"] or "312" in kept["lost"], kept
        else:
            assert "no queue is bound to exchange" in kept["lost"]
        left = dlr.read_dead_letters(settings(broker), unique_name, dead)
        assert [letter.correlation_id for letter in left] == ["cut", "lost"]
        assert left[0].refused_at_text == "2023-11-14 22:13:20" and left[0].truncated == 10**6
    finally:
        conn.release()


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
@pytest.mark.parametrize("broker", ["memory", "filesystem"], indirect=True)
def test_mistakes_are_one_line_and_change_nothing(broker, unique_name, monkeypatch, capsys):
    run = Commands(broker, unique_name, monkeypatch, capsys)
    exchange = compat.make_exchange(unique_name)
    dead = f"{unique_name}_x.dead"
    conn = kombu.Connection(
        broker.url,
        transport=transports.resolve(broker.url, None),
        transport_options=dict(broker.transport_options),
    )
    try:
        _put_dead_letter(conn, exchange, dead, "target", "only")
        for args, message in [
            (("list", f"{unique_name}_x"), f"'{unique_name}_x' is not a dead-letter queue"),
            (("show", "no-such.dead"), "no queue 'no-such.dead'"),
            (("show", dead, "--index", "2"), f"no dead letter 2 in queue {dead!r} (it holds 1)"),
            (("requeue", dead, "--index", "3", "--yes"), "no dead letter 3"),
        ]:
            code, out, err = run("deadletters", *args)
            assert code == 2, (args, err)
            assert err.startswith(f"flowengine deadletters: {message}"), err
            assert len(err.splitlines()) == 1 and out == ""
        # A requeue asks first; anything but yes requeues nothing.
        code, out, err = run("deadletters", "requeue", dead, "--all", stdin="n\n")
        assert code == 1 and "Requeue 1 dead letter(s)" in err and "Nothing requeued" in err
        assert inventory.queue_depth(settings(broker), unique_name, dead) == 1
        # Nothing bound to its routing key: kept, saying so (exit status 1).
        code, out, err = run("deadletters", "requeue", dead, "--all", stdin="yes\n")
        assert code == 1 and "Requeued 0 dead letter(s)" in out
        assert "Kept dead letter 1: no queue is bound" in err
        # `show` in text.
        code, out, err = run("deadletters", "show", dead)
        assert code == 0, err
        assert "reason:       refused for the test" in out
        assert "refused at:   2023-11-14 22:13:20 UTC by test" in out
        assert f"published to: exchange {unique_name!r}, routing key 'target'" in out
        assert 'correlation_id: "only"' in out and 'trace: "t-1"' in out
        assert '{"cid": "only"}' in out
    finally:
        conn.release()
