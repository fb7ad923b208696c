"""A throwaway PostgreSQL that accepts TLS connections only, with client certificates.

Built on ``tests/persistence/pg_server.py`` (initdb + postgres on a free
loopback port) and the throwaway certificates of ``tests/redis_tls.py``;
``pg_hba.conf`` lets in only TLS connections whose client certificate the
test CA signed and whose CN is the database user (``clientcert=verify-full``)::

    certs, server = pg_tls.start(tmp_path)
    url = pg_tls.url(server, certs)        # sslmode=verify-full, sslrootcert, sslcert, sslkey
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from urllib import parse

import redis_tls

from tests.persistence import pg_server


@dataclass(frozen=True)
class PgCertificates:
    """The test CA's files, and a client certificate whose CN is the database user."""

    base: redis_tls.Certificates
    client_cert: str
    client_key: str


def _client_certificate(directory: str, certs: redis_tls.Certificates) -> tuple[str, str]:
    # verify-full compares the certificate's CN with the user name.
    key, csr = os.path.join(directory, "pg-client.key"), os.path.join(directory, "pg-client.csr")
    cert = os.path.join(directory, "pg-client.crt")
    ca_key = os.path.join(os.path.dirname(certs.ca), "ca.key")
    redis_tls._run(
        "req",
        "-new",
        *redis_tls._EC_KEY,
        "-keyout",
        key,
        "-out",
        csr,
        "-subj",
        f"/CN={pg_server.PG_USER}",
    )
    redis_tls._run(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        certs.ca,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-out",
        cert,
        "-days",
        str(redis_tls.DAYS),
    )
    os.chmod(key, 0o600)  # libpq refuses a key others can read
    return cert, key


def make_certificates(directory: str | os.PathLike) -> PgCertificates:
    """The test CA, server and other-CA files, and a client certificate for the test user."""
    d = os.fspath(directory)
    certs = redis_tls.make_certificates(d)
    return PgCertificates(certs, *_client_certificate(d, certs))


def _configure(certs: PgCertificates):
    def configure(data: str, as_user: dict) -> list[str]:
        files = {}
        for name, src in (
            ("server.crt", certs.base.server_cert),
            ("server.key", certs.base.server_key),
            ("root.crt", certs.base.ca),
        ):
            files[name] = os.path.join(data, name)
            shutil.copyfile(src, files[name])
            if as_user:
                os.chown(files[name], as_user["user"], as_user["group"])
            os.chmod(files[name], 0o600)  # postgres refuses a key others can read
        with open(os.path.join(data, "pg_hba.conf"), "w") as fh:
            fh.write(
                "local all all trust\n"
                "hostssl all all 127.0.0.1/32 trust clientcert=verify-full\n"
                "hostnossl all all 127.0.0.1/32 reject\n"
            )
        return [
            "-c",
            "ssl=on",
            "-c",
            f"ssl_cert_file={files['server.crt']}",
            "-c",
            f"ssl_key_file={files['server.key']}",
            "-c",
            f"ssl_ca_file={files['root.crt']}",
        ]

    return configure


def start(directory: str | os.PathLike) -> tuple[PgCertificates, pg_server.PgServer]:
    """Certificates in ``directory``, and a TLS-only server using them (PgUnavailable)."""
    certs = make_certificates(directory)
    return certs, pg_server.start(configure=_configure(certs))


def url(
    server: pg_server.PgServer,
    certs: PgCertificates,
    *,
    ca: str | None = None,
    client_cert: bool = True,
    sslmode: str = "verify-full",
) -> str:
    """The server's URL with libpq's TLS parameters (``ca`` overrides the test CA)."""
    params = {"sslmode": sslmode, "sslrootcert": ca or certs.base.ca}
    if client_cert:
        params.update(sslcert=certs.client_cert, sslkey=certs.client_key)
    return f"{server.url}?{parse.urlencode(params)}"
