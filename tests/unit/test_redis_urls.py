"""Which transport ``sentinel://`` and ``rediss://`` URLs get, and what is shown of them."""

from __future__ import annotations

import ssl

import pytest

from flowengine import exceptions as exc
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging.settings import BrokerSettings, mask_options


def test_a_sentinel_url_list_gets_flowengines_transport_through_sentinel():
    # Given kombu's spelling of three Sentinels and the master's name
    url = "sentinel://:pw@h1:26379;sentinel://h2:26380;sentinel://h3"
    broker = BrokerSettings(url, transport_options={"master_name": "mymaster"})
    conn = broker.connection()
    # Then flowengine's reliable transport serves it, knowing every Sentinel
    assert conn.transport_cls == transports.SENTINEL
    assert type(conn.transport).__name__ == "SentinelTransport"
    assert conn.alt == url.split(";")
    assert broker.is_redis
    # And what is shown of it has no password
    assert "pw" not in broker.public_uri and broker.public_uri.startswith("sentinel://")
    # And moving to the next URL of the list (kombu's failover) keeps the transport
    conn.switch(conn.alt[1])
    assert conn.transport_cls == transports.SENTINEL


def test_rediss_gets_flowengines_transport_and_verifies_the_server_by_default():
    plain = BrokerSettings("rediss://h:6380/0").connection()
    assert plain.transport_cls == transports.REDIS
    # kombu alone would not check the certificate at all (ssl_cert_reqs none)
    assert plain.ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    given = BrokerSettings("rediss://h:6380/0?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem")
    assert given.connection().ssl == {"ssl_ca_certs": "/ca.pem", "ssl_certfile": "/c.pem"}
    assert given.public_uri == "rediss://h:6380/0"
    assert BrokerSettings("redis://h:6379/0").connection().ssl is False


def test_nested_secret_options_are_masked():
    options = {"master_name": "m", "sentinel_kwargs": {"password": "s3", "ssl": True}}
    assert mask_options(options) == {
        "master_name": "m",
        "sentinel_kwargs": {"password": "**", "ssl": True},
    }
    assert "s3" not in repr(BrokerSettings("sentinel://h1", transport_options=options))


def test_a_sentinel_url_without_the_service_name_is_refused_at_once():
    broker = BrokerSettings("sentinel://h1:26379;sentinel://h2:26379")
    with pytest.raises(exc.BrokerConfigError, match="master_name"):
        broker.connection()
    assert broker.public_uri.startswith("sentinel://h1:26379")
