"""pg_errors: libpq's TLS failures named in one line; database URLs without their passwords."""

from __future__ import annotations

import pytest

from flowengine.persistence.backends.sql import pg_errors

_LIBPQ = 'connection failed: connection to server at "db1" (10.0.0.5), port 5432 failed: '


@pytest.mark.parametrize(
    "detail,expected",
    [
        ("SSL error: certificate verify failed", "check sslrootcert"),
        ('server certificate for "db2" does not match host name "db1"', "does not name this host"),
        (
            'root certificate file "/x/ca.pem" does not exist\nEither provide the file, use the'
            " system's trusted roots with sslrootcert=system, or change sslmode",
            "the CA file cannot be read",
        ),
        ("FATAL:  connection requires a valid client certificate", "check sslcert and sslkey"),
        ("SSL error: tlsv13 alert certificate required", "check sslcert and sslkey"),
    ],
)
def test_a_tls_failure_is_named_in_one_line_with_libpq_words(detail, expected):
    # Given libpq's error for a TLS setting that cannot work, behind SQLAlchemy's
    try:
        try:
            raise OSError(_LIBPQ + detail)
        except OSError as driver:
            raise RuntimeError(
                "(psycopg.OperationalError) ...\n(Background on this error"
                " at: https://sqlalche.me/e/20/e3q8)"
            ) from driver
    except RuntimeError as wrapped:
        # When it is looked at
        line = pg_errors.tls_problem(wrapped)
    # Then one line names the key to fix and quotes libpq's first line
    assert line is not None and "\n" not in line
    assert expected in line
    assert detail.splitlines()[0].split(":")[-1].strip() in line


def test_other_connection_errors_are_not_tls_problems():
    error = OSError(_LIBPQ + "Connection refused\n\tIs the server running on that host?")
    assert pg_errors.tls_problem(error) is None


def test_safe_url_masks_the_password_and_every_password_in_the_query():
    url = (
        "postgresql://app:s3cret@db1:5432/flows?sslmode=verify-full&sslrootcert=/etc/ca.pem"
        "&sslpassword=k3y"
    )
    shown = pg_errors.safe_url(url)
    assert "s3cret" not in shown and "k3y" not in shown
    assert shown == (
        "postgresql://app:***@db1:5432/flows?sslmode=verify-full"
        "&sslrootcert=/etc/ca.pem&sslpassword=***"
    )
    assert pg_errors.safe_url("postgresql://app@db1/flows") == "postgresql://app@db1/flows"
