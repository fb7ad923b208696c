"""The Redis transport over TLS: ``rediss://`` with a CA and client certificates, and Sentinel.

Servers speak TLS only and require client certificates (``tls-auth-clients
yes``); certificates are made for each test with openssl
(``tests/redis_tls.py``). The TLS options are kombu's: ``ssl_*`` in the
URL's query for the server (the master, through Sentinel), and
``sentinel_kwargs`` for the Sentinels. A certificate that does not verify
(a wrong CA, or one naming another host) fails a command at once with one
line naming the cause, never the URL's password.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import redis_tls

from flowengine import engines
from tests.clusters.redis.conftest import sentinel_url
from tests.commands import sample_flows
from tests.reliability.harness import ROOT
from tests.worker_based import event_tasks
from tests.worker_based.executor_helpers import running_worker, unique

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("redis_sentinel")]

#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 60.0
#: A command refused for its certificate ends within this (s): one
#: handshake after the interpreter's start, not retries of an "unreachable" server.
FAIL_FAST_S = 10.0
PASSWORD = "not-to-be-shown"


def _query(ca: str, certs: redis_tls.Certificates) -> str:
    return f"?ssl_ca_certs={ca}&ssl_certfile={certs.client_cert}&ssl_keyfile={certs.client_key}"


def _sentinel_tls(certs: redis_tls.Certificates, ca: str) -> dict:
    """``sentinel_kwargs`` for TLS to the Sentinels (redis-py's arguments)."""
    return {
        "ssl": True,
        "ssl_ca_certs": ca,
        "ssl_certfile": certs.client_cert,
        "ssl_keyfile": certs.client_key,
    }


def _run_flow(**conn) -> None:
    exchange = unique()
    with running_worker(exchange, "t", [event_tasks.Step], **conn):
        engine = engines.load(
            sample_flows.steps(3),
            store={"v0": 0},
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            transition_timeout=WAIT_S,
            **conn,
        )
        engine.run()
    assert engine.storage.fetch("v3") == 3


def _inspect(url: str, *options: str) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "inspect",
        "ping",
        "--url",
        url,
        "--timeout",
        "1",
        *options,
    ]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, env=env)
    return done, time.monotonic() - started


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done
    assert len(lines) == 1, done.stderr
    assert PASSWORD not in done.stderr
    return lines[0]


def test_a_flow_runs_over_rediss_with_a_ca_and_a_client_certificate(tls_redis):
    # Given a TLS-only server requiring client certificates, and a rediss://
    # URL naming the CA and the client's certificate and key (kombu's spelling)
    certs, server = tls_redis
    url = f"rediss://127.0.0.1:{server.port}/0{_query(certs.ca, certs)}"
    # When a worker and an engine run a flow through it, Then it succeeds
    _run_flow(url=url)


def _certificate_for_another_host(certs: redis_tls.Certificates, directory) -> tuple[str, str]:
    """A server certificate the tests' CA signed for a name that is not 127.0.0.1."""
    key = os.path.join(os.path.dirname(certs.ca), "ca.key")
    return redis_tls._sign(
        str(directory),
        "elsewhere",
        (certs.ca, key),
        "subjectAltName=DNS:elsewhere.invalid\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n",
    )


@pytest.mark.parametrize("wrong", ["ca", "host-name"])
def test_a_certificate_that_does_not_verify_fails_at_once_in_one_line(tls_redis, tmp_path, wrong):
    # Given a client trusting a CA that did not sign the server's certificate,
    # or a server whose certificate names another host (the URL has a password)
    certs, server = tls_redis
    ca, port = certs.other_ca, server.port
    if wrong == "host-name":
        cert, key = _certificate_for_another_host(certs, tmp_path)
        elsewhere = redis_tls.start_tls_redis(
            redis_tls.Certificates(
                certs.ca, cert, key, certs.client_cert, certs.client_key, certs.other_ca
            ),
            auth_clients=True,
        )
        ca, port = certs.ca, elsewhere.port
    try:
        url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0{_query(ca, certs)}"
        # When a command connects
        done, elapsed = _inspect(url)
    finally:
        if wrong == "host-name":
            elsewhere.stop()
    # Then it fails at once, with one line naming the cause and what to check
    line = _one_line(done)
    sys.stderr.write(f"\n[redis tls, wrong {wrong}] {elapsed:.2f} s: {line}\n")
    assert elapsed < FAIL_FAST_S, elapsed
    assert "TLS certificate verification failed" in line, line
    assert "check ssl_ca_certs" in line and "host name" in line, line
    assert (
        "self-signed certificate" in line or "unable to get" in line
        if wrong == "ca"
        else "mismatch" in line
    ), line


def test_a_flow_runs_through_sentinel_with_tls_on_every_link(tls_sentinel_cluster):
    # Given a primary, a replica and three Sentinels speaking TLS only, and the
    # master's TLS options in the URL, the Sentinels' in sentinel_kwargs
    cluster = tls_sentinel_cluster
    certs = cluster.tls
    conn = {
        "url": sentinel_url(cluster, _query(certs.ca, certs)),
        "transport_options": {
            "master_name": cluster.service,
            "sentinel_kwargs": _sentinel_tls(certs, certs.ca),
        },
    }
    # When a worker and an engine run a flow through them, Then it succeeds
    _run_flow(**conn)
    # And Sentinels trusting the wrong CA fail a command at once, in one line
    wrong = _sentinel_tls(certs, certs.other_ca)
    done, elapsed = _inspect(
        sentinel_url(cluster, _query(certs.ca, certs)),
        "--transport-option",
        f"master_name={cluster.service}",
        "--transport-option",
        f"sentinel_kwargs={json.dumps(wrong)}",
    )
    line = _one_line(done)
    sys.stderr.write(
        f"\n[redis sentinel tls, wrong CA for the Sentinels] {elapsed:.2f} s: {line}\n"
    )
    assert "TLS certificate verification failed" in line, line
    assert "ssl_ca_certs in sentinel_kwargs" in line, line
    assert elapsed < FAIL_FAST_S, elapsed
