"""Redis clients of jobboards introduce themselves as flowengine's (see redis_identity.py)."""

from __future__ import annotations

import pytest
import redis

from flowengine.jobs.backends import redis_client
from flowengine.utils import redis_identity


def test_a_board_client_is_given_the_driver_identity_made_once():
    driver = redis_identity.connection_kwargs().get("driver_info")
    if driver is None:
        pytest.skip(f"redis-py {redis.__version__} has no DriverInfo (reads its version once)")
    for conf in ({"url": "redis://127.0.0.1:1/0"}, {"host": "127.0.0.1", "port": 1}):
        client = redis_client.make_client(conf)  # connects on first use only
        try:
            assert client.connection_pool.connection_kwargs["driver_info"] is driver
        finally:
            client.close()


def test_board_and_transport_clients_speak_resp2():
    if int(redis.__version__.split(".")[0]) < 5:
        pytest.skip(f"redis-py {redis.__version__} speaks RESP2 only")
    assert redis_identity.connection_kwargs()["protocol"] == 2
    client = redis_client.make_client({"url": "redis://127.0.0.1:1/0"})  # no I/O yet
    try:
        assert client.connection_pool.connection_kwargs["protocol"] == 2
    finally:
        client.close()
