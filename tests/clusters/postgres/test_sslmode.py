"""The SQL persistence backend and the PostgreSQL jobboard over TLS (libpq's ``sslmode``).

The server (``tests/pg_tls.py``) accepts TLS connections only, from clients
whose certificate the test CA signed and whose CN is the user
(``clientcert=verify-full``). Clients use ``sslmode=verify-full`` with
``sslrootcert`` (and ``sslcert``/``sslkey``) in the URL's query, as libpq
spells them. A wrong CA or a missing client certificate fails at once with
one line naming the cause; no password shows in full.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
import uuid

import pg_tls
import pytest
import sqlalchemy as sa

from flowengine import exceptions as exc
from flowengine.jobs import backends
from flowengine.persistence import models
from flowengine.persistence.backends import impl_sqlalchemy

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("postgres_tls")]

#: A TLS setting that cannot work fails within this (s): one handshake, no
#: retries (validate()'s 5 attempts would wait 7.5 s between them).
FAIL_FAST_S = 6.0
#: Bound on every wait (s): only a bug reaches it.
WAIT_S = 30.0
#: Attempts validate() may make: a TLS failure must not use them.
VALIDATE_RETRIES = 5
_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def test_the_sql_persistence_over_verify_full_with_a_client_certificate(tls_pg):
    # Given the SQL backend on a URL with sslmode=verify-full, the CA and a client certificate
    certs, server = tls_pg
    backend = impl_sqlalchemy.SQLAlchemyBackend({"connection": pg_tls.url(server, certs)})
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            # When it migrates, saves and reads a logbook
            conn.validate()
            conn.upgrade()
            book = conn.save_logbook(models.LogBook("over-tls"))
            # Then it reads back, over a TLS session
            assert conn.get_logbook(book.uuid).name == "over-tls"
        with backend.engine.connect() as raw:
            ssl_on = raw.execute(
                sa.text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            ).scalar_one()
        assert ssl_on is True
    finally:
        backend.close()


def test_the_postgresql_jobboard_over_tls_posts_claims_consumes_and_notifies(tls_pg):
    # Given two PostgreSQL boards on the TLS URL (LISTEN/NOTIFY over TLS too)
    certs, server = tls_pg
    conf = {"board": pg_tls.url(server, certs), "namespace": f"t{uuid.uuid4().hex[:8]}"}
    poster, worker = backends.fetch("poster", conf), backends.fetch("worker", conf)
    poster.connect()
    worker.connect()
    try:
        # When one posts a job and the other claims and consumes it
        job = poster.post("over-tls", details={"n": 1})
        worker.claim(job, "me")
        worker.consume(job, "me")
        # Then the poster's wait returns the outcome
        outcome = poster.wait_for_outcome(job.uuid, WAIT_S)
        assert outcome is not None and outcome.outcome == "succeeded"
    finally:
        poster.close()
        worker.close()


def _secret_url(server, certs, **kwargs) -> str:
    # trust authentication ignores the password: it is there to be masked.
    url = pg_tls.url(server, certs, **kwargs).replace("flowengine@", "flowengine:s3cret-pw@")
    return url + "&sslpassword=k3y-pw"


def _fails_fast(call) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(exc.FlowEngineError) as caught:
        call()
    return caught.value, time.monotonic() - started


def test_a_wrong_ca_fails_at_once_in_one_line_without_passwords(tls_pg, caplog):
    # Given the persistence backend and a board trusting a CA that did not sign
    # the server's certificate, on URLs carrying a password and an sslpassword
    certs, server = tls_pg
    url = _secret_url(server, certs, ca=certs.base.other_ca)
    backend = impl_sqlalchemy.SQLAlchemyBackend({"connection": url})
    board = backends.fetch("wrong-ca", {"board": url})
    caplog.set_level(logging.DEBUG)
    try:
        # When each connects (validate() being allowed several attempts)
        store_error, store_s = _fails_fast(
            lambda: backend.get_connection().validate(max_retries=VALIDATE_RETRIES)
        )
        board_error, board_s = _fails_fast(board.connect)
    finally:
        board.close()
        backend.close()
    # Then each fails at once, not as an unreachable (retried) server
    assert isinstance(store_error, exc.StorageFailure)
    assert isinstance(board_error, exc.JobFailure)
    assert not isinstance(board_error, exc.BoardUnavailable)
    for error, elapsed in ((store_error, store_s), (board_error, board_s)):
        assert elapsed < FAIL_FAST_S, elapsed
        # with one line naming the cause and the key to fix
        line = str(error)
        assert "\n" not in line, line
        assert "TLS certificate verification failed" in line and "sslrootcert" in line, line
        # and no password in full, there or in any log record
        assert "s3cret-pw" not in line and "k3y-pw" not in line, line
        assert ":***@" in line and "sslpassword=***" in line, line
        sys.stderr.write(f"\n[postgresql tls wrong CA] {type(error).__name__}: {line}\n")
    assert "s3cret-pw" not in caplog.text and "k3y-pw" not in caplog.text


def test_a_client_without_a_certificate_is_told_the_server_refused_it(tls_pg):
    # Given a board trusting the right CA but showing no client certificate
    certs, server = tls_pg
    board = backends.fetch("no-cert", {"board": pg_tls.url(server, certs, client_cert=False)})
    try:
        # When it connects
        error, elapsed = _fails_fast(board.connect)
    finally:
        board.close()
    # Then it fails at once, saying the server refused its certificate
    assert elapsed < FAIL_FAST_S, elapsed
    assert not isinstance(error, exc.BoardUnavailable)
    assert "refused this client's TLS certificate" in str(error), error
    sys.stderr.write(f"\n[postgresql tls no client certificate] {error}\n")
    assert "sslcert" in str(error)


def test_the_cli_names_a_wrong_ca_in_one_line(tls_pg):
    # Given `flowengine jobs list` on the TLS server trusting the wrong CA
    certs, server = tls_pg
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "jobs",
        "list",
        "--board",
        _secret_url(server, certs, ca=certs.base.other_ca),
    ]
    env = {**os.environ, "PYTHONPATH": _ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # When it runs
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, env=env)
    # Then it exits 1 with one line naming the cause, and no password
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "TLS certificate verification failed" in lines[0], lines[0]
    assert "s3cret-pw" not in done.stderr and "k3y-pw" not in done.stderr
    sys.stderr.write(f"\n[postgresql tls wrong CA, CLI] {lines[0]}\n")
