"""amqps:// with a CA and client certificates, against a TLS-only RabbitMQ the test starts.

A flow runs over TLS on worker processes given the ssl options on the
command line; a client trusting another CA, or dialling a host name the
server's certificate does not hold, fails at once with one line saying so.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time

import pytest
import rabbitmq_tls

from flowengine import engines, exceptions, states
from flowengine.patterns import unordered_flow as uf
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import ROOT, Conn, Workers, env

pytestmark = [pytest.mark.xdist_group("rabbitmq_tls"), pytest.mark.broker]

#: A refused certificate must be reported this fast (s): no retrying for the
#: engine's start timeout, nor for kombu's connect retries.
FAIL_FAST_S = 10.0
#: Bounded waits (s), only so that a broken setup fails instead of hanging.
RUN_TIMEOUT_S = 60.0


def _engine(flow, exchange: str, url: str, ssl_options: dict):
    return engines.load(
        flow,
        engine="worker-based",
        exchange=exchange,
        topics=["tls"],
        url=url,
        transport_options={"ssl": ssl_options},
        transition_timeout=RUN_TIMEOUT_S,
    )


def test_a_flow_runs_over_tls_with_client_certificates(tls_rabbitmq, unique_name, tmp_path):
    server, certs = tls_rabbitmq
    # Given a worker process given the CA and its certificate on the command line
    # (JSON: cert_reqs is ssl.CERT_REQUIRED's value)
    options = {**rabbitmq_tls.client_ssl(certs), "cert_reqs": int(ssl.CERT_REQUIRED)}
    conn = Conn("amqps", url=server.url, transport_options={"ssl": options})
    records = str(tmp_path / "records.jsonl")
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(conn, unique_name, "tls", records, str(logs))
    names = [f"t{i}" for i in range(5)]
    flow = uf.Flow("tls").add(
        *[fault_tasks.Step(name, provides=f"r{i}", inject={"n": i}) for i, name in enumerate(names)]
    )
    engine = _engine(flow, unique_name, server.url, options)
    try:
        workers.start()
        # When a flow runs on it over amqps://
        engine.run()
    finally:
        workers.stop_all()
    # Then every task ran, once
    assert engine.storage.get_flow_state() == states.SUCCESS, workers.logs()
    assert [engine.storage.fetch(f"r{i}") for i in range(5)] == list(range(5))
    assert len(checker.check(checker.read_records(records), names).done_once) == 5


def _fails_fast(flow_name: str, exchange: str, url: str, ssl_options: dict) -> str:
    flow = uf.Flow(flow_name).add(fault_tasks.Step("never", inject={"n": 0}))
    engine = _engine(flow, exchange, url, ssl_options)
    started = time.monotonic()
    with pytest.raises(exceptions.BrokerConfigError) as caught:
        engine.run()
    took = time.monotonic() - started
    text = str(caught.value)
    assert took < FAIL_FAST_S, f"took {took:.1f} s: {text}"
    assert "\n" not in text
    assert "guest:guest" not in text  # the password is never shown
    return text


def test_a_wrong_ca_fails_fast_with_one_line(tls_rabbitmq, unique_name):
    server, certs = tls_rabbitmq
    # When the client trusts another CA than the one that signed the server's certificate
    text = _fails_fast(
        "wrong-ca", unique_name, server.url, rabbitmq_tls.client_ssl(certs, ca=certs.other_ca)
    )
    print(f"\n[rabbitmq tls] wrong CA: {text}")
    # Then the engine says so at once, in one line
    assert "certificate is not trusted" in text and "ca_certs" in text, text


def test_a_wrong_host_name_fails_fast_with_one_line(tls_rabbitmq, unique_name):
    server, certs = tls_rabbitmq
    # When the client dials an address the server's certificate does not name
    url = server.url.replace("127.0.0.1", rabbitmq_tls.OTHER_LOOPBACK)
    text = _fails_fast("wrong-host", unique_name, url, rabbitmq_tls.client_ssl(certs))
    print(f"\n[rabbitmq tls] wrong host name: {text}")
    # Then the engine says so at once, in one line
    assert "does not name the host" in text, text


def test_the_command_line_says_a_wrong_ca_in_one_line(tls_rabbitmq, unique_name):
    server, certs = tls_rabbitmq
    options = {
        **rabbitmq_tls.client_ssl(certs, ca=certs.other_ca),
        "cert_reqs": int(ssl.CERT_REQUIRED),
    }
    # When `flowengine queues` is pointed at the TLS broker trusting the wrong CA
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowengine",
            "queues",
            "--url",
            server.url,
            "--exchange",
            unique_name,
            "--transport-option",
            f"ssl={json.dumps(options)}",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env(""),
        cwd=ROOT,
    )
    # Then it ends with one line on stderr saying why, without the password
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    print(
        f"\n[rabbitmq tls] flowengine queues, wrong CA (exit {result.returncode}):"
        f" {result.stderr.strip()}"
    )
    assert result.returncode != 0
    assert len(lines) == 1, result.stderr
    assert "certificate is not trusted" in lines[0], result.stderr
    assert "guest:guest" not in result.stderr


def test_no_client_certificate_fails_fast_with_one_line(tls_rabbitmq, unique_name):
    server, certs = tls_rabbitmq
    # When the client trusts the right CA but has no certificate of its own
    options = {"ca_certs": certs.ca, "cert_reqs": ssl.CERT_REQUIRED}
    text = _fails_fast("no-client-cert", unique_name, server.url, options)
    print(f"\n[rabbitmq tls] no client certificate: {text}")
    # Then the engine says that the broker wants one, in one line
    assert "client certificate" in text and "certfile" in text, text
