"""A throwaway RabbitMQ that speaks AMQP over TLS only, with throwaway certificates.

::

    certs = redis_tls.make_certificates(tmp_path)   # CA, server, client, another CA
    server = rabbitmq_tls.start_tls_rabbitmq(certs)
    ssl = rabbitmq_tls.client_ssl(certs)            # py-amqp's ssl options
    url = server.url                                # amqps://guest:guest@127.0.0.1:PORT//

The server listens for TLS on 127.0.0.1 (a name its certificate holds) and
on the same port on 127.0.0.2 (a loopback address its certificate does not
name: the "wrong host name" a client may dial), never in clear. It asks
every client for a certificate its CA signed (``verify_peer`` and
``fail_if_no_peer_cert``). The certificates are ``tests/redis_tls.py``'s.
"""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
from typing import Any

import brokers
import redis_tls

#: The second loopback address: a host the server's certificate does not name.
OTHER_LOOPBACK = "127.0.0.2"


def client_ssl(certs: redis_tls.Certificates, ca: str | None = None) -> dict[str, Any]:
    """py-amqp's ssl options for a client with its certificate (``ca``: the CA trusted)."""
    return {
        "ca_certs": ca or certs.ca,
        "certfile": certs.client_cert,
        "keyfile": certs.client_key,
        "cert_reqs": ssl.CERT_REQUIRED,
    }


def _conf(port: int, certs: redis_tls.Certificates) -> str:
    return (
        f"listeners.tcp = none\n"
        f"listeners.ssl.default = 127.0.0.1:{port}\n"
        f"listeners.ssl.other = {OTHER_LOOPBACK}:{port}\n"
        f"ssl_options.cacertfile = {certs.ca}\n"
        f"ssl_options.certfile = {certs.server_cert}\n"
        f"ssl_options.keyfile = {certs.server_key}\n"
        "ssl_options.verify = verify_peer\n"
        "ssl_options.fail_if_no_peer_cert = true\n"
        "loopback_users.guest = true\n"
        "disk_free_limit.absolute = 1MB\n"
    )


def start_tls_rabbitmq(certs: redis_tls.Certificates) -> brokers.BrokerProcess:
    """rabbitmq-server on a free loopback port, TLS only; raise BrokerUnavailable."""
    script = brokers.rabbitmq_binary()
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    if script is None or not os.access(epmd, os.X_OK):
        raise brokers.BrokerUnavailable(
            "rabbitmq-server (or Erlang's epmd) not found (apt-get install rabbitmq-server)"
        )
    # The Erlang VM reads the key files as the user it runs as: us.
    for path in (certs.server_key, certs.server_cert, certs.ca):
        os.chmod(path, 0o600)

    def make() -> brokers.BrokerProcess:
        wd = tempfile.mkdtemp(prefix="flowengine-rabbitmq-tls-")
        port, dist_port, epmd_port = (brokers.free_port(), brokers.free_port(), brokers.free_port())
        env = brokers._rabbitmq_env(wd, port, dist_port, epmd_port)
        with open(env["RABBITMQ_CONFIG_FILE"], "w") as fh:  # TLS listeners instead
            fh.write(_conf(port, certs))
        log = os.path.join(wd, "rabbitmq.out")
        return brokers.BrokerProcess(
            "rabbitmq-tls",
            f"amqps://guest:guest@127.0.0.1:{port}//",
            port,
            wd,
            log,
            launches=[
                brokers._Launch(
                    [epmd, "-port", str(epmd_port), "-address", "127.0.0.1"],
                    os.path.join(wd, "epmd.log"),
                    env,
                    lambda: brokers.tcp_open(epmd_port),
                    brokers.EPMD_START_TIMEOUT_S,
                ),
                # Listening is not serving yet (the vhost comes later): a
                # client retries its first connection within its own bound.
                brokers._Launch(
                    [script],
                    log,
                    env,
                    lambda: _tls_login(port, certs),
                    brokers.RABBITMQ_START_TIMEOUT_S,
                ),
            ],
        )

    return brokers._start_with_retries(make)


def _tls_login(port: int, certs: redis_tls.Certificates) -> bool:
    import amqp

    try:
        conn = amqp.Connection(
            f"127.0.0.1:{port}",
            ssl=dict(client_ssl(certs), server_hostname="127.0.0.1"),
            connect_timeout=2,
        )
        conn.connect()
        conn.close()
        return True
    except Exception:
        return False
