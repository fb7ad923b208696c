"""Signed messages under attack: a real worker process with a key, real Redis.

Given a worker started with ``FLOWENGINE_SECRET``, when it receives unsigned,
forged, tampered, expired, replayed-after-expiry and oversized requests, then
none of them runs (the task body writes a ledger line each time it runs) and
good signed requests still succeed; the executor side refuses forged replies.
"""

from __future__ import annotations

import json
import time
import uuid

import kombu
import pytest

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.transports import topology
from flowengine.engines.worker_based.wire import signing
from tests.reliability import ledger
from tests.reliability.outage_procs import running_workers, worker_env
from tests.reliability.outage_tasks import Mark
from tests.worker_based.wire_helpers import Client

pytestmark = [pytest.mark.broker, pytest.mark.slow]

KEY = "fault-test-shared-key-" + "k" * 16
ATTACKER_KEY = "attacker-own-key-" + "a" * 16

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 30.0

#: How long the replayed request stays valid (s): long enough for its first
#: delivery to run, short so the replay happens soon after it expired.
REPLAY_VALID_S = 2.0


class RawSender:
    """Publishes hand-made REQUEST messages (bytes, properties, headers as given)."""

    def __init__(self, url: str, exchange: str, topic: str, reply_to: str) -> None:
        self._conn = kombu.Connection(url)
        self._producer = kombu.Producer(
            self._conn.channel(), auto_declare=False, exchange=topology.make_exchange(exchange)
        )
        self._topic = topic
        self._reply_to = reply_to

    def build(
        self, token: str, path: str, expires: float | None = None, pad: str = ""
    ) -> tuple[bytes, dict, dict]:
        """A valid request for Mark(token) as (body, properties, headers), unsigned."""
        cid = uuid.uuid4().hex
        arguments = {"token": token, "path": path}
        if pad:
            arguments["pad"] = pad
        body = json.dumps(
            pr.Request(Mark(name=f"mark-{token}"), cid, pr.EXECUTE, arguments).to_dict()
        ).encode("utf-8")
        props = {"type": pr.REQUEST, "correlation_id": cid, "reply_to": self._reply_to}
        headers: dict = {pr.HEADER_ATTEMPT: 0, pr.HEADER_ORIGIN: "test:0"}
        if expires is not None:
            headers[pr.HEADER_EXPIRES] = expires
        return body, props, headers

    def send(self, body: bytes, props: dict, headers: dict) -> None:
        self._producer.publish(
            body,
            routing_key=self._topic,
            content_type="application/json",
            content_encoding="utf-8",
            headers=headers,
            **props,
        )

    def close(self) -> None:
        self._conn.release()


def test_forged_unsigned_expired_replayed_and_oversized_requests_never_run(redis_url, tmp_path):
    exchange, topic = f"sig-{uuid.uuid4().hex[:8]}", "signed"
    path = str(tmp_path / "ledger")
    ring, attacker = signing.Keyring([KEY]), signing.Keyring([ATTACKER_KEY])
    # Given a worker process with the key (one thread: requests run in arrival order)
    env = worker_env(FLOWENGINE_SECRET=KEY)
    with (
        Client(exchange, url=redis_url, secret=KEY) as client,
        running_workers(
            1, redis_url, exchange, topic, str(tmp_path), threads=1, env=env
        ) as workers,
    ):
        assert client.wait_for(lambda: client.notifies, WAIT_S), workers.log_text()
        raw = RawSender(redis_url, exchange, topic, client.uuid)
        try:
            # And a good signed request that runs, captured for a replay
            replay = raw.build("good-1", path, expires=time.time() + REPLAY_VALID_S)
            replay[2].update(ring.sign(*replay))
            raw.send(*replay)
            assert client.final(replay[1]["correlation_id"], WAIT_S)["state"] == pr.SUCCESS
            # When the bad messages arrive
            bad = {}
            body, props, headers = raw.build("unsigned", path)
            raw.send(body, props, headers)
            bad["unsigned"] = props
            body, props, headers = raw.build("forged-other-key", path)
            headers.update(attacker.sign(body, props, headers))
            raw.send(body, props, headers)
            bad["forged-other-key"] = props
            body, props, headers = raw.build("forged-guess", path)
            headers.update(
                {
                    signing.HEADER_KEY_ID: ring.signing_key_id,
                    signing.HEADER_SIGNATURE: "v1:" + "ab" * 32,
                }
            )
            raw.send(body, props, headers)
            bad["forged-guess"] = props
            body, props, headers = raw.build("tampered", path)
            headers.update(ring.sign(body, props, headers))
            headers[pr.HEADER_ATTEMPT] = 5  # changed after signing
            raw.send(body, props, headers)
            bad["tampered"] = props
            body, props, headers = raw.build("expired", path, expires=time.time() - 1)
            headers.update(ring.sign(body, props, headers))
            raw.send(body, props, headers)
            bad["expired"] = props
            body, props, headers = raw.build("oversized", path, pad="x" * (pr.MAX_BODY_BYTES + 1))
            headers.update(ring.sign(body, props, headers))
            raw.send(body, props, headers)
            bad["oversized"] = props
            # ... and the captured good request is replayed once it has expired
            # (waiting for a clock deadline is what is tested, not a synchronisation)
            time.sleep(max(0.0, replay[2][pr.HEADER_EXPIRES] - time.time()) + 0.05)
            raw.send(*replay)
            # Then a good signed request sent after them all still succeeds
            cid = client.request(
                Mark(name="mark-good-2"),
                routing_key=topic,
                arguments={"token": "good-2", "path": path},
            )
            assert client.final(cid, WAIT_S)["state"] == pr.SUCCESS, workers.log_text()
            # And a forged reply to the (signing) client is refused, not recorded
            forged_reply = kombu.Producer(
                raw._conn.channel(), auto_declare=False, exchange=topology.make_exchange(exchange)
            )
            forged_reply.publish(
                json.dumps({"state": pr.SUCCESS, "data": {"result": 1}}),
                routing_key=client.uuid,
                type=pr.RESPONSE,
                correlation_id="forged-reply",
                content_type="application/json",
                content_encoding="utf-8",
            )
            assert client.wait_for(lambda: client.proxy.unverified_count >= 1, WAIT_S)
            assert client.states("forged-reply") == []
        finally:
            raw.close()
    logs = workers.log_text()
    # Then the checker: good requests done once, every bad one run 0 times
    verdict = ledger.check(path, ["good-1", "good-2"])
    assert verdict.done_once == 2 and not verdict.unexpected, str(verdict)
    # And each refusal was logged with its reason (four signature failures)
    assert logs.count("Refused message (") == 4, logs
    assert "not signed" in logs and "unknown key id" in logs
    assert logs.count("does not match its content") == 2
    assert "exceeds the limit" in logs
    # And no bad request got a SUCCESS (unverified ones get no answer at all)
    for name in ("unsigned", "forged-other-key", "forged-guess", "tampered"):
        assert client.states(bad[name]["correlation_id"]) == [], name
    for name in ("expired", "oversized"):
        assert pr.SUCCESS not in client.states(bad[name]["correlation_id"]), name
