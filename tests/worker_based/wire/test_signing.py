"""Signed messages: the keyring, and signing/verification through real proxies."""

from __future__ import annotations

import logging

import pytest

from flowengine import exceptions as exc
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.wire import signing
from tests.worker_based import worker_tasks
from tests.worker_based.executor_helpers import WAIT_S, running_executor, unique
from tests.worker_based.wire_helpers import Client, running_worker

KEY = "k" * 32
OLD_KEY = "o" * 32
BODY = b'{"task_cls": "x"}'
PROPS = {"type": "REQUEST", "correlation_id": "c-1", "reply_to": "r-1"}
HEADERS = {"expires": 1700000000.25, "attempt": 0, "origin": "h:1"}


def _signed(ring: signing.Keyring, body: bytes = BODY, props=None, headers=None):
    props = dict(PROPS if props is None else props)
    headers = dict(HEADERS if headers is None else headers)
    headers.update(ring.sign(body, props, headers))
    return body, props, headers


def test_a_signed_message_verifies():
    ring = signing.Keyring([KEY])
    ring.verify(*_signed(ring))


@pytest.mark.parametrize(
    "change",
    [
        ("body", b'{"task_cls": "y"}'),
        ("type", "NOTIFY"),
        ("correlation_id", "c-2"),
        ("reply_to", "attacker"),
        ("expires", 1800000000.0),
        ("attempt", 1),
    ],
)
def test_changing_any_covered_field_breaks_the_signature(change):
    # Given a message signed with the shared key
    ring = signing.Keyring([KEY])
    body, props, headers = _signed(ring)
    # When one covered field is changed (or added) on the way
    name, value = change
    if name == "body":
        body = value
    elif name in props:
        props[name] = value
    else:
        headers[name] = value
    # Then verification refuses it
    with pytest.raises(exc.UnverifiedMessage, match="does not match"):
        ring.verify(body, props, headers)


def test_removing_expires_breaks_the_signature():
    ring = signing.Keyring([KEY])
    body, props, headers = _signed(ring)
    del headers["expires"]
    with pytest.raises(exc.UnverifiedMessage):
        ring.verify(body, props, headers)


def test_unsigned_wrong_key_and_unknown_scheme_are_refused():
    ring = signing.Keyring([KEY])
    with pytest.raises(exc.UnverifiedMessage, match="not signed"):
        ring.verify(BODY, PROPS, HEADERS)
    other = signing.Keyring(["x" * 32])
    with pytest.raises(exc.UnverifiedMessage, match="unknown key id"):
        ring.verify(*_signed(other))
    body, props, headers = _signed(ring)
    headers[signing.HEADER_SIGNATURE] = "v9:" + headers[signing.HEADER_SIGNATURE][3:]
    with pytest.raises(exc.UnverifiedMessage, match="scheme"):
        ring.verify(body, props, headers)
    # A forged signature under our key id
    headers[signing.HEADER_SIGNATURE] = "v1:" + "0" * 64
    with pytest.raises(exc.UnverifiedMessage, match="does not match"):
        ring.verify(body, props, headers)


def test_rotation_new_key_signs_old_key_still_verifies():
    # Given senders still on the old key and a receiver that rotated: [new, old]
    old = signing.Keyring([OLD_KEY])
    rotated = signing.Keyring([KEY, OLD_KEY])
    # Then the receiver accepts both, and signs with the new one
    rotated.verify(*_signed(old))
    assert rotated.signing_key_id == signing.key_id(KEY.encode())
    # And a receiver that has dropped the old key refuses old signatures
    with pytest.raises(exc.UnverifiedMessage, match="unknown key id"):
        signing.Keyring([KEY]).verify(*_signed(old))


def test_keys_are_never_shown_and_short_keys_refused():
    ring = signing.Keyring([KEY])
    assert KEY not in repr(ring) and KEY not in str(ring.key_ids)
    with pytest.raises(ValueError, match="at least"):
        signing.Keyring(["short"])


def test_load_keyring_sources(tmp_path):
    assert signing.load_keyring(None, environ={}) is None
    assert signing.load_keyring(False, environ={signing.SECRET_ENV: KEY}) is None
    ring = signing.load_keyring(None, environ={signing.SECRET_ENV: KEY})
    assert ring.signing_key_id == signing.key_id(KEY.encode())
    path = tmp_path / "keys"
    path.write_text(f"# new key first\n{KEY}\n\n{OLD_KEY}\n")
    ring = signing.load_keyring(
        None, environ={signing.SECRET_FILE_ENV: str(path), signing.SECRET_ENV: "ignored" * 4}
    )
    assert ring.key_ids == sorted([signing.key_id(KEY.encode()), signing.key_id(OLD_KEY.encode())])
    assert ring.signing_key_id == signing.key_id(KEY.encode())
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no key"):
        signing.load_keyring(None, environ={signing.SECRET_FILE_ENV: str(path)})


# --- through proxies (memory transport) ---


def test_signed_worker_and_executor_run_a_task():
    # Given a worker and an executor sharing a key
    exchange, topic = unique(), unique("t")
    with (
        running_worker(
            exchange, topic, [worker_tasks.Add], transport="memory", secret=KEY
        ) as worker,
        running_executor(exchange, [topic], secret=[KEY]) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        # When a task runs
        fut = executor.execute_task(worker_tasks.Add("a"), "u-1", {"x": 1, "y": 2})
        # Then it succeeds, and nothing was refused on either side
        assert fut.result(WAIT_S) == (base.EXECUTED, 3)
        assert worker.server.proxy.unverified_count == 0
        assert executor._proxy.unverified_count == 0


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_worker_with_key_refuses_unsigned_requests_unanswered(caplog):
    # Given a worker with a key and a client without one
    exchange, topic = unique(), unique("t")
    with (
        running_worker(
            exchange, topic, [worker_tasks.Add], transport="memory", secret=KEY
        ) as worker,
        Client(exchange, transport="memory", secret=False) as client,
    ):
        dispatcher = worker.server.proxy.dispatcher
        # When the client sends a request
        with caplog.at_level(logging.WARNING):
            cid = client.request(
                worker_tasks.Add("a"), arguments={"x": 1, "y": 2}, routing_key=topic
            )
            # Then the worker refuses it, says why and counts it (the
            # warning is logged on the consumer's thread after the count
            # changes: wait for the line itself)
            assert client.wait_for(
                lambda: any(
                    "not signed" in r.getMessage() and cid in r.getMessage()
                    for r in list(caplog.records)
                ),
                WAIT_S,
            )
        assert client.states(cid) == []  # no answer to an untrusted reply address
        assert dispatcher.unverified_count == 1
        assert worker.server.proxy.unverified_count == 1


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_executor_with_key_refuses_unsigned_replies():
    # Given an executor with a key and a worker without it
    exchange, topic = unique(), unique("t")
    with (
        running_worker(exchange, topic, [worker_tasks.Add], transport="memory", secret=False),
        running_executor(exchange, [topic], secret=KEY, transition_timeout=WAIT_S) as executor,
    ):
        # Then the worker's announcements are refused: it is never used
        assert executor.wait_for_workers(1, 0.5) == 1
        assert executor._proxy.unverified_count >= 1


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_password_never_logged_on_connection_failures(caplog):
    # Given a proxy whose broker is unreachable, with a password in its URL
    secret_pw = "s3cr3t-pw-value"
    port = __import__("socket").socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    proxy = px.Proxy(
        "t",
        unique(),
        broker=BrokerSettings(
            f"amqp://user:{secret_pw}@127.0.0.1:{free}//",
            retry_options={
                "max_retries": 1,
                "interval_start": 0,
                "interval_step": 0,
                "interval_max": 0,
            },
        ),
        options=px.ProxyOptions(publish_timeout_s=0.5),
    )
    from flowengine.engines.worker_based import protocol as pr

    # When publishing fails
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(exc.PublishTimeout) as info:
            proxy.publish(pr.Notify(), "t")
    # Then the error is recoverable and typed, and no log line or message has the password
    assert isinstance(info.value, exc.RecoverableError)
    assert secret_pw not in str(info.value)
    for record in caplog.records:
        text = record.getMessage() + (
            logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
        )
        assert secret_pw not in text
    assert secret_pw not in str(proxy.connection_details)
