"""A throwaway Redis that speaks TLS only, and throwaway certificates made with openssl.

::

    certs = redis_tls.make_certificates(tmp_path)        # CA, server, client, another CA
    server = redis_tls.start_tls_redis(certs, auth_clients=True)
    conf = {"host": "127.0.0.1", "port": server.port, "ssl": True,
            "ssl_ca_certs": certs.ca, "ssl_certfile": certs.client_cert,
            "ssl_keyfile": certs.client_key}

The server listens on ``--tls-port`` only (``--port 0``); with
``auth_clients`` it refuses clients without a certificate its CA signed
(``tls-auth-clients yes``). Keys are EC P-256: made in milliseconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import brokers

#: The certificates' validity: they live as long as one test.
DAYS = 1
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certificates:
    """Paths of the PEM files of one test."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    #: A CA that signed none of these: the "wrong CA" a misconfigured client trusts.
    other_ca: str


def openssl_binary() -> str:
    """Path of openssl; raises BrokerUnavailable without it."""
    path = shutil.which("openssl")
    if path is None:
        raise brokers.BrokerUnavailable("openssl not found on PATH (apt-get install openssl)")
    return path


def _run(*args: str) -> None:
    subprocess.run([openssl_binary(), *args], check=True, capture_output=True, timeout=30)


def _make_ca(directory: str, name: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    _run(
        "req",
        "-x509",
        *_EC_KEY,
        "-keyout",
        key,
        "-out",
        cert,
        "-days",
        str(DAYS),
        "-subj",
        f"/CN=flowengine test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    return cert, key


def _sign(directory: str, name: str, ca: tuple[str, str], extensions: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    csr, ext = os.path.join(directory, f"{name}.csr"), os.path.join(directory, f"{name}.ext")
    with open(ext, "w") as fh:
        fh.write(extensions)
    _run(
        "req", "-new", *_EC_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN=flowengine test {name}"
    )
    _run(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca[0],
        "-CAkey",
        ca[1],
        "-CAcreateserial",
        "-out",
        cert,
        "-days",
        str(DAYS),
        "-extfile",
        ext,
    )
    return cert, key


def make_certificates(directory: str | os.PathLike) -> Certificates:
    """A CA, a server certificate for 127.0.0.1/localhost, a client one, and another CA."""
    d = os.fspath(directory)
    ca = _make_ca(d, "ca")
    server = _sign(
        d,
        "server",
        ca,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\n",
    )
    client = _sign(
        d, "client", ca, "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    )
    other_ca, _ = _make_ca(d, "other-ca")
    return Certificates(ca[0], server[0], server[1], client[0], client[1], other_ca)


def client_kwargs(certs: Certificates) -> dict:
    """TaskFlow's ssl keys (also redis-py's arguments) for a client with its certificate."""
    return {
        "ssl": True,
        "ssl_ca_certs": certs.ca,
        "ssl_certfile": certs.client_cert,
        "ssl_keyfile": certs.client_key,
    }


def start_tls_redis(certs: Certificates, *, auth_clients: bool) -> brokers.BrokerProcess:
    """A redis-server on a free loopback port that speaks TLS only."""

    def command(binary: str, port: int, wd: str) -> list[str]:
        return [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            wd,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            "--tls-cert-file",
            certs.server_cert,
            "--tls-key-file",
            certs.server_key,
            "--tls-ca-cert-file",
            certs.ca,
            "--tls-auth-clients",
            "yes" if auth_clients else "no",
        ]

    # PING needs a TLS handshake: listening is enough to call it started.
    server = brokers.start_redis_like("redis-tls", command, ready=brokers.tcp_open)
    server.url = f"rediss://127.0.0.1:{server.port}/0"
    return server
