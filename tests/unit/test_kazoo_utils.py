"""flowengine.utils.kazoo_utils against a real ZooKeeper (TaskFlow's helper names)."""

from __future__ import annotations

import uuid

import pytest

# Without kazoo (the zookeeper extra) flowengine.utils.kazoo_utils raises
# MissingExtra, which is no ImportError: skip on kazoo itself first.
pytest.importorskip("kazoo", reason="needs kazoo (pip install 'flowengine[zookeeper]')")
kazoo_utils = pytest.importorskip("flowengine.utils.kazoo_utils")

from flowengine import exceptions as exc  # noqa: E402


@pytest.fixture
def client(zk_hosts):
    made = kazoo_utils.make_client({"hosts": zk_hosts, "timeout": 5})
    made.start(timeout=15)
    yield made
    kazoo_utils.finalize_client(made)


def test_conf_from_url_reads_hosts_path_and_options():
    conf = kazoo_utils.conf_from_url("zookeeper://a:1,b:2/x/y/?timeout=3", {"path": "/keep"})
    assert conf == {"hosts": "a:1,b:2", "path": "/keep", "timeout": "3"}
    assert kazoo_utils.conf_from_url("zookeeper:") == {}
    with pytest.raises(ValueError, match="Not a zookeeper:// URL"):
        kazoo_utils.conf_from_url("redis://x")


@pytest.mark.parametrize(
    "hosts, expected", [(["h1:1", "h2:2"], "h1:1,h2:2"), ({"h1": 1}, "h1:1"), (" h:3 ", "h:3")]
)
def test_make_client_accepts_taskflows_host_forms(hosts, expected):
    assert kazoo_utils.parse_hosts(hosts) == expected
    client = kazoo_utils.make_client({"hosts": hosts, "use_ssl": "false"})
    kazoo_utils.finalize_client(client)


def test_a_client_backs_off_reconnecting_to_ten_seconds_not_kazoos_hour():
    # kazoo's own connection retry backs off to 3,600 s: after a long outage
    # a conductor would wait up to an hour more once the ensemble was back.
    client = kazoo_utils.make_client({"hosts": "127.0.0.1:1"})
    retry = client._connection.retry_sleeper  # the one its connect loop copies
    assert retry.max_delay == kazoo_utils.CONNECTION_RETRY_MAX_DELAY_S == 10.0
    assert retry.max_tries is None  # for ever: kazoo's own, kept
    kazoo_utils.finalize_client(client)


def test_a_given_connection_retry_is_kept():
    client = kazoo_utils.make_client(
        {"hosts": "127.0.0.1:1", "connection_retry": {"max_tries": 3, "max_delay": 2}}
    )
    retry = client._connection.retry_sleeper
    assert (retry.max_tries, retry.max_delay) == (3, 2)
    kazoo_utils.finalize_client(client)


def test_make_client_refuses_empty_hosts():
    with pytest.raises(TypeError, match="Invalid hosts format"):
        kazoo_utils.make_client({"hosts": []})


def test_checked_commit_raises_with_the_failed_operation(client):
    path = f"/fe-test/{uuid.uuid4().hex}"
    client.ensure_path(path)
    txn = client.transaction()
    txn.create(f"{path}/a", b"1")
    txn.check(path, 42)  # wrong version: the whole transaction is rolled back
    with pytest.raises(
        kazoo_utils.KazooTransactionException, match="BadVersionError@CheckVersion"
    ) as info:
        kazoo_utils.checked_commit(txn)
    assert len(info.value.failures) >= 1
    assert client.exists(f"{path}/a") is None
    assert kazoo_utils.checked_commit(client.transaction()) == []


def test_check_compatible_compares_with_the_servers_version(client):
    kazoo_utils.check_compatible(client, (3, 4, 0))
    with pytest.raises(exc.IncompatibleVersion, match="zookeeper >= 99.0 required"):
        kazoo_utils.check_compatible(client, (99, 0))
    with pytest.raises(exc.IncompatibleVersion, match="zookeeper <= 3.0 required"):
        kazoo_utils.check_compatible(client, None, (3, 0))
