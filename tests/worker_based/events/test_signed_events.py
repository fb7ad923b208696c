"""Signed events: a receiver with the key shows only events signed with it.

Each test ends with a signed marker event: on one transport events arrive in
the order they were published, so once the marker is in, everything sent
before it was either handled or dropped.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import subprocess
import sys
import threading

import kombu
import pytest

from flowengine import engines, retry
from flowengine.engines.worker_based import events as ev
from flowengine.engines.worker_based.events import channel as event_channel
from flowengine.engines.worker_based.events import receiver as event_receiver
from flowengine.engines.worker_based.events import signing as event_signing
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import signing
from flowengine.engines.worker_based.worker_side.worker_events import EventsMiddleware
from flowengine.patterns import linear_flow
from tests.worker_based import event_tasks
from tests.worker_based.event_helpers import WAIT_S, Collector, collecting, flow_finished
from tests.worker_based.executor_helpers import MEMORY, running_worker, unique
from tests.worker_based.test_cli import _env

KEY = "k" * 32
OTHER_KEY = "o" * 32
MARKER = "marker"


def _send(
    exchange: str, hostname: str, secret=None, event_type: str = "worker-heartbeat", **conn
) -> None:
    """Publish one event from a sender of its own and wait until it left."""
    publisher = ev.EventPublisher(exchange, hostname=hostname, secret=secret, **(conn or MEMORY))
    publisher.send(event_type)
    assert publisher.flush(WAIT_S), "event was not published"
    publisher.close()


def _send_raw(exchange: str, body: bytes, headers: dict, **conn) -> None:
    """Publish a hand-made event message (what a forger can do)."""
    conn = conn or MEMORY
    connection = event_channel.connection(
        BrokerSettings(conn.get("url"), conn.get("transport"), conn.get("transport_options") or {})
    )
    try:
        producer = kombu.Producer(connection.channel(), exchange=event_channel.exchange(exchange))
        producer.publish(
            body,
            routing_key="worker-heartbeat",
            headers=headers,
            content_type="application/json",
            content_encoding="utf-8",
        )
    finally:
        event_channel.release(connection)


def _event_body(hostname: str) -> bytes:
    return json.dumps(
        {
            "type": "worker-heartbeat",
            "hostname": hostname,
            "pid": 1,
            "clock": 1,
            "timestamp": 0.0,
            "utcoffset": 0,
        }
    ).encode("utf-8")


class _Listening:
    """A receiver (optionally with a key) running on a thread of its own."""

    def __init__(self, exchange: str, secret=None, **conn) -> None:
        self.collector = Collector()
        self.receiver = ev.EventReceiver(
            exchange, self.collector, secret=secret, **(conn or MEMORY)
        )
        self._thread = threading.Thread(target=self.receiver.run, daemon=True)

    def __enter__(self) -> _Listening:
        self._thread.start()
        assert self.receiver.wait_ready(WAIT_S), "event receiver did not start"
        return self

    def __exit__(self, *exc_info) -> None:
        self.receiver.stop()
        self._thread.join(WAIT_S)

    def wait_marker(self) -> None:
        assert self.collector.wait_for(
            lambda events: any(e["hostname"] == MARKER for e in events)
        ), "no marker"

    def senders(self) -> list[str]:
        return [e["hostname"] for e in self.collector.events]


# --- verification ------------------------------------------------------------


def test_signed_events_reach_a_receiver_holding_the_key():
    # Given a receiver holding the key (and an older one, as during a rotation)
    exchange = unique()
    with _Listening(exchange, secret=[OTHER_KEY, KEY]) as seen:
        # When a sender with that key publishes
        _send(exchange, "signed", secret=KEY)
        _send(exchange, MARKER, secret=KEY)
        seen.wait_marker()
    # Then its event arrives, whole, and nothing was dropped
    assert seen.senders() == ["signed", MARKER]
    assert seen.collector.events[0]["type"] == "worker-heartbeat"
    assert seen.receiver.unverified_count == 0


def test_unsigned_wrong_key_and_forged_events_are_dropped_and_counted(caplog, monkeypatch):
    # Given a receiver holding the key, warning about every drop (no rate limit)
    monkeypatch.setattr(event_receiver, "UNVERIFIED_WARNING_PERIOD_S", 0.0)
    exchange = unique()
    genuine = _event_body("genuine")
    signature = event_signing.sign(signing.Keyring([KEY]), genuine)
    with (
        caplog.at_level(logging.WARNING, logger="flowengine.engines.worker_based.events"),
        _Listening(exchange, secret=KEY) as seen,
    ):
        # When events arrive unsigned, signed with another key, with a
        # genuine signature over another body, and with a mangled signature
        _send(exchange, "unsigned")
        _send(exchange, "wrong-key", secret=OTHER_KEY)
        _send_raw(exchange, _event_body("forged"), signature)
        _send_raw(exchange, genuine, {**signature, signing.HEADER_SIGNATURE: "v1"})
        _send(exchange, MARKER, secret=KEY)
        seen.wait_marker()
    # Then none reached the handler, each was counted, and each drop says why
    assert seen.senders() == [MARKER]
    assert seen.receiver.unverified_count == 4
    reasons = [r.getMessage() for r in caplog.records if "Dropped an event" in r.getMessage()]
    assert len(reasons) == 4
    assert "not signed" in reasons[0]
    assert "unknown key id" in reasons[1]
    assert "does not match" in reasons[2] and "does not match" in reasons[3]


def test_drop_warnings_are_rate_limited_but_every_drop_is_counted(caplog):
    exchange = unique()
    with (
        caplog.at_level(logging.WARNING, logger="flowengine.engines.worker_based.events"),
        _Listening(exchange, secret=KEY) as seen,
    ):
        for i in range(3):
            _send(exchange, f"unsigned-{i}")
        _send(exchange, MARKER, secret=KEY)
        seen.wait_marker()
    assert seen.receiver.unverified_count == 3
    # The period (10 s) did not pass between the drops: one warning for all three
    warnings = [r for r in caplog.records if "Dropped an event" in r.getMessage()]
    assert len(warnings) == 1 and "not signed" in warnings[0].getMessage()


def test_a_receiver_without_a_key_accepts_signed_and_unsigned_events():
    exchange = unique()
    with _Listening(exchange) as seen:
        _send(exchange, "unsigned")
        _send(exchange, "signed", secret=KEY)
        _send(exchange, MARKER, secret=OTHER_KEY)
        seen.wait_marker()
    assert seen.senders() == ["unsigned", "signed", MARKER]
    assert seen.receiver.keyring is None and seen.receiver.unverified_count == 0


def test_publishers_sign_only_when_given_a_key():
    assert ev.EventPublisher("x", **MEMORY).keyring is None
    assert ev.EventPublisher("x", secret=False, **MEMORY).keyring is None
    assert ev.EventPublisher("x", secret=KEY, **MEMORY).keyring.key_ids == [
        signing.key_id(KEY.encode())
    ]
    # A worker's events are signed with the worker's keyring, and only when on
    broker = BrokerSettings(transport="memory", secret=[KEY])
    on = EventsMiddleware.create("x", "w", ["t"], [], broker, enabled=True)
    off = EventsMiddleware.create("x", "w", ["t"], [], broker, enabled=False)
    assert on.publisher.keyring is broker.keyring and off.publisher.keyring is None
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ev.EventReceiver("x", print, secret="short", **MEMORY)


def test_signed_events_on_redis(redis_url):
    # Given a receiver with the key on Redis (events are pub/sub messages there)
    exchange = unique()
    conn = {"url": redis_url}
    with _Listening(exchange, secret=KEY, **conn) as seen:
        # When a signed, an unsigned and a forged event are published
        _send(exchange, "signed", secret=KEY, **conn)
        _send(exchange, "unsigned", **conn)
        _send_raw(
            exchange,
            _event_body("forged"),
            event_signing.sign(signing.Keyring([KEY]), _event_body("genuine")),
            **conn,
        )
        _send(exchange, MARKER, secret=KEY, **conn)
        seen.wait_marker()
    # Then only the signed ones arrived
    assert seen.senders() == ["signed", MARKER]
    assert seen.receiver.unverified_count == 2


# --- workers and engines -----------------------------------------------------


def test_task_retried_carries_the_request_uuid_and_engine_events_are_signed(tmp_path):
    # Given a worker and an engine signing with the key, a receiver holding it,
    # and a flow whose retry controller re-runs a task that fails once
    exchange = unique()
    flow = linear_flow.Flow("retried", retry=retry.Times(3, name="again")).add(
        event_tasks.FailOnce("flaky", inject={"marker": str(tmp_path / "marker")}, provides="out")
    )
    with (
        collecting(exchange, secret=KEY, **MEMORY) as seen,
        running_worker(exchange, "t", [event_tasks.FailOnce], events=True, secret=KEY, **MEMORY),
    ):
        # When it runs
        engine = engines.load(
            flow,
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            events=True,
            secret=KEY,
            transition_timeout=WAIT_S,
            **MEMORY,
        )
        engine.run()
        assert seen.wait_for(flow_finished())
    # Then the engine's signed events arrived, and task-retried names the
    # controller's request uuid, its run and its attempt
    retried = seen.of_type("task-retried")
    assert len(retried) == 1
    assert retried[0]["uuid"] == engine.storage.get_atom_uuid("again")
    assert retried[0]["name"] == "again"
    assert retried[0]["root_id"] == seen.of_type("flow-started")[0]["root_id"]
    assert retried[0]["attempt"] == 1
    for field in ev.STANDARD_FIELDS:
        assert field in retried[0]


def test_worker_events_are_signed_with_the_worker_keyring():
    # Given a worker signing its messages, with events on
    exchange = unique()
    with running_worker(
        exchange, "t", [event_tasks.Step], events=True, secret=KEY, **MEMORY
    ) as worker:
        assert worker.server.events.publisher.keyring is not None
        # When a receiver holding the key listens while the worker works
        with _Listening(exchange, secret=KEY) as seen:
            engine = engines.load(
                linear_flow.Flow("one").add(event_tasks.Step("s")),
                store={"value": 1},
                engine="worker-based",
                exchange=exchange,
                topics=["t"],
                secret=KEY,
                **MEMORY,
            )
            engine.run()
            # The worker sends task-succeeded after its reply, from its own
            # publisher: waited for itself, as a marker sent now may overtake it.
            assert seen.collector.wait_for(
                lambda events: any(e["type"] == "task-succeeded" for e in events)
            ), seen.senders()
            _send(exchange, MARKER, secret=KEY)
            seen.wait_marker()
    # Then the worker's task events arrived, verified
    types = [e["type"] for e in seen.collector.events]
    assert "task-received" in types and "task-succeeded" in types
    assert seen.receiver.unverified_count == 0


# --- flowengine events --------------------------------------------------------


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_events_command_shows_only_events_signed_with_its_keys(tmp_path):
    # Given `flowengine events --json --secret-file` on the filesystem transport
    exchange = unique()
    keys = tmp_path / "keys"
    keys.write_text(f"# signing key first\n{KEY}\n")
    conn = {"transport": "filesystem", "transport_options": {"data_folder": str(tmp_path / "bus")}}
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "events",
        "--exchange",
        exchange,
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={tmp_path / 'bus'}",
        "--json",
        "--secret-file",
        str(keys),
    ]
    proc = subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stdout: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [stdout.put(x) for x in iter(proc.stdout.readline, "")] + [stdout.put("")],
        daemon=True,
    ).start()
    try:
        listening = proc.stderr.readline()
        assert "Listening for events" in listening and "verifying signatures" in listening
        # When an unsigned, a wrong-key and a signed event are published
        _send(exchange, "unsigned", **conn)
        _send(exchange, "wrong-key", secret=OTHER_KEY, **conn)
        _send(exchange, MARKER, secret=KEY, **conn)
        # Then the first line printed is the signed one
        line = stdout.get(timeout=WAIT_S)  # queue.Empty fails the test
        assert json.loads(line)["hostname"] == MARKER
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(WAIT_S)
        err = proc.stderr.read()
    assert proc.returncode == 0
    assert "Dropped an event" in err and "not signed" in err


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_events_command_refuses_a_key_file_without_keys(tmp_path):
    empty = tmp_path / "keys"
    empty.write_text("# nothing here\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowengine",
            "events",
            "--transport",
            "memory",
            "--secret-file",
            str(empty),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 2
    assert "holds no key" in done.stderr


def test_the_worker_cli_reads_its_secret_file(tmp_path):
    # Given a key file with a comment, a blank line and two keys
    path = tmp_path / "keys"
    path.write_text("# rotation: new key first\n\n" + "n" * 32 + "\n" + "o" * 32 + "\n")
    # When `flowengine worker --secret-file` reads it
    from flowengine import cli

    # Then it gets both keys, the first one signing
    assert cli._read_secret_file(str(path)) == ["n" * 32, "o" * 32]
    assert cli._read_secret_file(None) is None
