"""Fixtures of the PostgreSQL TLS tests: one TLS-only server per test session.

``tls_pg`` (session): ``(certificates, server)``, a PostgreSQL started by
``pg_tls.start`` (``tests/pg_tls.py``) (``ssl=on``, TLS connections only, client certificates
checked with ``clientcert=verify-full``) and throwaway certificates made by
openssl. Tests using it are marked ``xdist_group("postgres_tls")``.
"""

from __future__ import annotations

import os
import sys

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _path in (_TESTS, os.path.dirname(_TESTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import brokers  # noqa: E402
import pg_tls  # noqa: E402

from tests.persistence import pg_server  # noqa: E402

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def tls_pg(tmp_path_factory):
    """``(certificates, server)``: a TLS-only PostgreSQL requiring client certificates."""
    try:
        certs, server = pg_tls.start(tmp_path_factory.mktemp("pg-certs"))
    except (pg_server.PgUnavailable, brokers.BrokerUnavailable) as e:
        reason = f"PostgreSQL with TLS unavailable: {e}"
    else:
        sys.stderr.write(f"\n[postgresql tls] up at {server.url} in {server.start_time_s:.2f} s\n")
        yield certs, server
        server.stop()
        return
    if IN_CI:  # a broken install must fail CI, never skip it green
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)
