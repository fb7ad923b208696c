"""The Redis board over TLS with TaskFlow's ssl keys, against a real TLS-only redis-server.

Certificates are made for each test with openssl (``tests/redis_tls.py``):
a CA, a server certificate for 127.0.0.1, a client certificate (the server
requires one: ``tls-auth-clients yes``) and another CA nobody used. The keys
are the ones Octavia's ``jobboard_redis_backend_ssl_options`` hands over:
``ssl``, ``ssl_keyfile``, ``ssl_certfile``, ``ssl_ca_certs``, ``ssl_cert_reqs``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from flowengine import exceptions as exc
from flowengine.jobs import backends

pytestmark = [pytest.mark.broker]

#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 30.0
#: A certificate that does not verify must fail within this (s): one
#: handshake, not redis-py's retries with back-off.
FAIL_FAST_S = 3.0
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _keys(certs, server) -> dict:
    # As an oslo.config dict option gives them: strings, and None for unset ones.
    return {
        "board": "redis",
        "host": "127.0.0.1",
        "port": server.port,
        "ssl": "true",
        "ssl_ca_certs": certs.ca,
        "ssl_certfile": certs.client_cert,
        "ssl_keyfile": certs.client_key,
        "ssl_cert_reqs": "required",
        "sentinel": None,
        "namespace": f"t{uuid.uuid4().hex[:8]}",
    }


@pytest.mark.parametrize("style", ["taskflow-keys", "rediss-url"])
def test_a_board_over_tls_posts_claims_consumes_and_notifies(tls_redis, style):
    # Given two boards reaching a TLS-only server with TaskFlow's ssl keys
    # (or a rediss:// URL and the certificate keys)
    certs, server = tls_redis
    conf = _keys(certs, server)
    if style == "rediss-url":
        conf = {
            "board": f"rediss://127.0.0.1:{server.port}/0?namespace={conf['namespace']}",
            **{k: v for k, v in conf.items() if k.startswith("ssl_")},
        }
    poster, worker = backends.fetch("poster", conf), backends.fetch("worker", conf)
    poster.connect()
    worker.connect()
    try:
        # When one posts a job and the other claims and consumes it
        job = poster.post("over-tls", details={"n": 1})
        worker.claim(job, "me")
        worker.consume(job, "me")
        # Then the poster's wait (woken by the board's channel, over TLS) returns the outcome
        outcome = poster.wait_for_outcome(job.uuid, WAIT_S)
        assert outcome is not None and outcome.outcome == "succeeded"
    finally:
        poster.close()
        worker.close()


def test_a_wrong_ca_fails_at_once_naming_the_cause(tls_redis):
    # Given a board that trusts a CA which did not sign the server's certificate
    certs, server = tls_redis
    conf = {**_keys(certs, server), "ssl_ca_certs": certs.other_ca}
    board = backends.fetch("wrong-ca", conf)
    # When it connects
    started = time.monotonic()
    with pytest.raises(exc.JobFailure) as caught:
        board.connect()
    elapsed = time.monotonic() - started
    board.close()
    # Then it fails at once, not as an unreachable (retried) server, and says why
    assert not isinstance(caught.value, exc.BoardUnavailable)
    assert elapsed < FAIL_FAST_S, elapsed
    message = str(caught.value).splitlines()[0]
    assert "TLS certificate verification failed" in message
    assert "ssl_ca_certs" in message


def test_the_cli_says_what_is_wrong_with_the_ca_in_one_line(tls_redis):
    # Given `flowengine jobs list` on a rediss:// board trusting the wrong CA
    certs, server = tls_redis
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "jobs",
        "list",
        "--board",
        f"rediss://127.0.0.1:{server.port}/0",
        "--board-option",
        f"ssl_ca_certs={certs.other_ca}",
    ]
    env = {**os.environ, "PYTHONPATH": _ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # When it runs
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, env=env)
    # Then it exits 1 with one line naming the cause
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "certificate verification failed" in lines[0]
    assert "self-signed certificate" in lines[0] or "unable to get" in lines[0], lines[0]
