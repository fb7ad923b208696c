"""The ZooKeeper board and persistence over TLS, against the ensemble's ``secureClientPort``.

The nodes require client certificates (``ssl.clientAuth=need``) signed by the
test CA (``tests/redis_tls.py``). The keys are TaskFlow's (``use_ssl``,
``verify_certs``, ``certfile``, ``keyfile``) plus flowengine's ``ca``.
A wrong CA, or no client certificate, fails at once with one line naming
the cause: not after kazoo's retries as an "unreachable" ensemble.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

import pytest

from flowengine import exceptions as exc
from flowengine.jobs import backends
from flowengine.persistence import models
from flowengine.persistence.backends import impl_zookeeper

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("zookeeper_ensemble")]

#: A TLS setting that cannot work fails within this (s): one handshake, a
#: fraction of the 15 s kazoo's retries would take (slack for a loaded machine).
FAIL_FAST_S = 8.0
#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 30.0
_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def _board_conf(cluster, **overrides) -> dict:
    return {
        "board": "zookeeper",
        "path": "/flowengine-test/tls-jobs",
        "namespace": f"t{uuid.uuid4().hex[:10]}",
        **cluster.tls_conf(**overrides),
    }


def test_a_board_and_persistence_over_tls_with_taskflow_keys(zk_ensemble):
    # Given a ZooKeeper persistence backend and two boards on the TLS ports
    # of all three nodes (the server's version is checked, over TLS too)
    persistence = impl_zookeeper.ZkBackend(
        {"path": f"/flowengine-test/tls-{uuid.uuid4().hex[:8]}", **zk_ensemble.tls_conf()}
    )
    conf = _board_conf(zk_ensemble)
    poster = backends.fetch("poster", conf, persistence=persistence)
    worker = backends.fetch("worker", conf, persistence=persistence)
    try:
        with contextlib.closing(persistence.get_connection()) as conn:
            conn.upgrade()
            book = conn.save_logbook(models.LogBook("over-tls"))
        poster.connect()
        worker.connect()
        # When one posts a job and the other claims and consumes it
        job = poster.post("over-tls", book)
        worker.claim(job, "me")
        worker.consume(job, "me")
        # Then the poster (woken by a watch over TLS) sees the outcome, and the
        # logbook reads back
        outcome = poster.wait_for_outcome(job.uuid, WAIT_S)
        assert outcome is not None and outcome.outcome == "succeeded"
        with contextlib.closing(persistence.get_connection()) as conn:
            assert conn.get_logbook(book.uuid).name == "over-tls"
        assert persistence.client.use_ssl
    finally:
        poster.close()
        worker.close()
        persistence.close()


def _fails_fast(connect) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(exc.FlowEngineError) as caught:
        connect()
    return caught.value, time.monotonic() - started


def test_a_wrong_ca_fails_at_once_in_one_line(zk_ensemble):
    # Given a board and a persistence backend trusting a CA that did not sign
    # the servers' certificates
    board = backends.fetch("wrong-ca", _board_conf(zk_ensemble, ca=zk_ensemble.certs.other_ca))
    persistence = impl_zookeeper.ZkBackend(
        {"path": "/flowengine-test/tls", **zk_ensemble.tls_conf(ca=zk_ensemble.certs.other_ca)}
    )
    try:
        # When each connects
        board_error, board_s = _fails_fast(board.connect)
        store_error, store_s = _fails_fast(persistence.get_connection)
    finally:
        board.close()
        persistence.close()
    # Then each fails within one handshake, not as an unreachable (retried) server,
    # with one line naming the cause and the key to fix
    assert isinstance(board_error, exc.JobFailure)
    assert not isinstance(board_error, exc.BoardUnavailable)
    assert isinstance(store_error, exc.StorageFailure)
    for error, elapsed in ((board_error, board_s), (store_error, store_s)):
        assert elapsed < FAIL_FAST_S, elapsed
        line = str(error)
        assert "\n" not in line
        assert "TLS certificate verification failed" in line and "check ca" in line, line
        sys.stderr.write(f"\n[zookeeper tls wrong CA] {type(error).__name__}: {line}\n")


def test_a_client_without_a_certificate_is_told_the_server_refused_it(zk_ensemble):
    # Given a board trusting the right CA but showing no client certificate
    board = backends.fetch("no-cert", _board_conf(zk_ensemble, certfile=None, keyfile=None))
    try:
        # When it connects
        error, elapsed = _fails_fast(board.connect)
    finally:
        board.close()
    # Then it fails at once, saying the server refused its certificate
    assert elapsed < FAIL_FAST_S, elapsed
    assert "refused this client's TLS certificate" in str(error), error
    sys.stderr.write(f"\n[zookeeper tls no client certificate] {error}\n")
    assert "certfile" in str(error)


def test_the_cli_names_a_wrong_ca_in_one_line(zk_ensemble):
    # Given `flowengine jobs list` on the TLS ports trusting the wrong CA
    certs = zk_ensemble.certs
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "jobs",
        "list",
        "--board",
        f"zookeeper://{zk_ensemble.ensemble.secure_hosts}/flowengine-test/cli",
        "--board-option",
        "use_ssl=true",
        "--board-option",
        f"ca={certs.other_ca}",
        "--board-option",
        f"certfile={certs.client_cert}",
        "--board-option",
        f"keyfile={certs.client_key}",
    ]
    env = {**os.environ, "PYTHONPATH": _ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # When it runs
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, env=env)
    # Then it exits 1 with one line naming the cause
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "TLS certificate verification failed" in lines[0], lines[0]
    sys.stderr.write(f"\n[zookeeper tls wrong CA, CLI] {lines[0]}\n")
