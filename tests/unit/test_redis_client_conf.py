"""How a Redis board's conf (TaskFlow's keys, Octavia's values) becomes a redis-py client.

No server: clients connect on first use only, so what they were built with
can be read off their connection pools. The real servers are in
tests/jobs/test_redis_sentinel.py and tests/jobs/test_redis_tls.py.
"""

from __future__ import annotations

import pytest
from redis import sentinel as redis_sentinel

from flowengine.jobs import backends
from flowengine.jobs.backends import redis_client


def _pool_kwargs(client) -> dict:
    return client.connection_pool.connection_kwargs


def test_configuration_strings_are_converted_and_none_means_absent():
    kwargs = redis_client.client_kwargs(
        {
            "host": "h",
            "port": "6380",
            "db": "2",
            "retry_on_timeout": "true",
            "health_check_interval": "30",
            "ssl": "false",
            "socket_timeout": "1.5",
            "ssl_keyfile": None,
            "ssl_certfile": None,
            "namespace": "not a client key",
        }
    )
    kwargs.pop("maint_notifications_config", None)
    assert kwargs == {
        "host": "h",
        "port": 6380,
        "db": 2,
        "retry_on_timeout": True,
        "health_check_interval": 30,
        "ssl": False,
        "socket_timeout": 1.5,
    }


def test_a_direct_client_gets_flowengines_defaults_unless_told_otherwise():
    client = redis_client.make_client({"host": "127.0.0.1", "port": 1, "socket_timeout": 1})
    try:
        kwargs = _pool_kwargs(client)
        assert kwargs["socket_timeout"] == 1.0
        assert kwargs["socket_connect_timeout"] == redis_client.redis_utils.SOCKET_TIMEOUT_S
        assert kwargs["decode_responses"] is True
    finally:
        client.close()


def test_sentinel_keys_as_octavia_passes_them():
    conf = {
        "host": "127.0.0.1",
        "port": 26379,
        "db": 0,
        "password": "pw",
        "sentinel": "mymaster",
        "sentinel_fallbacks": ["[::1]:26380", "localhost:26381"],
        "sentinel_kwargs": {"ssl": False, "ssl_keyfile": None, "password": "spw"},
        "ssl": False,
        "ssl_keyfile": None,
        "ssl_ca_certs": "/ca.pem",
        "ssl_cert_reqs": "required",
    }
    client = redis_client.make_client(conf)
    try:
        pool = client.connection_pool
        assert isinstance(pool, redis_sentinel.SentinelConnectionPool)
        assert pool.service_name == "mymaster"
        manager = pool.sentinel_manager
        addresses = [
            (
                s.connection_pool.connection_kwargs["host"],
                s.connection_pool.connection_kwargs["port"],
            )
            for s in manager.sentinels
        ]
        assert addresses == [("127.0.0.1", 26379), ("::1", 26380), ("localhost", 26381)]
        assert manager.sentinel_kwargs == {"ssl": False, "password": "spw"}
        # ssl is off: no ssl_* key reaches the (plain) master connections
        assert not [k for k in _pool_kwargs(client) if k.startswith("ssl")]
        assert _pool_kwargs(client)["password"] == "pw"
        assert _pool_kwargs(client)["decode_responses"] is True
    finally:
        redis_client.close_client(client)


def test_sentinel_from_a_board_url():
    board = backends.fetch(
        "b",
        "redis://:pw@127.0.0.1:26390/3?namespace=x&sentinel=svc"
        "&sentinel_fallbacks=127.0.0.1:26391,127.0.0.1:26392",
    )
    client = board._store._client
    try:
        pool = client.connection_pool
        assert pool.service_name == "svc"
        ports = [
            s.connection_pool.connection_kwargs["port"] for s in pool.sentinel_manager.sentinels
        ]
        assert ports == [26390, 26391, 26392]
        assert _pool_kwargs(client)["db"] == 3
        assert _pool_kwargs(client)["password"] == "pw"
        assert "svc" in board._store._where and "pw" not in board._store._where
    finally:
        board.close()


@pytest.mark.parametrize("entry", ["26379", "host:", "host:port", "[::1]"])
def test_a_malformed_fallback_is_named(entry):
    with pytest.raises(ValueError, match="sentinel_fallbacks entry"):
        redis_client.make_client(
            {"host": "h", "port": 1, "sentinel": "s", "sentinel_fallbacks": [entry]}
        )
