"""Shared pytest fixtures: throwaway brokers, broker parametrisation, markers.

Session fixtures belong to one pytest process: under ``-n 2`` (pytest-xdist,
the README's test command) each of the two starts brokers of its own, so no
test shares a broker's state with one running in the other.

Fixtures
- ``redis_url`` / ``amqp_url`` (session): a redis-server / rabbitmq-server
  started on a free loopback port for this test session and stopped at its
  end.  Set ``FLOWENGINE_TEST_REDIS_URL`` / ``FLOWENGINE_TEST_AMQP_URL`` to use
  an existing broker instead.  When the server cannot be started the test is
  skipped with the reason — except under ``CI=true``, where it fails.
- ``broker`` (function): parametrised over memory, filesystem, redis, amqp;
  a :class:`Broker` with ``url`` and ``transport_options`` for kombu.
- ``broker_url``: just ``broker.url``.
- ``unique_name``: a fresh name for exchanges/topics so tests never share queues.
- ``pg_url`` (session): a throwaway PostgreSQL cluster (``tests/persistence/pg_server.py``)
  or ``FLOWENGINE_TEST_PG_URL``; for the persistence and the ``flows`` command tests.
- ``private_redis`` / ``private_rabbitmq`` (function): a broker of the test's
  own, with ``kill()`` / ``start()`` / ``restart()`` for outage tests.
- ``sentinel_cluster`` (function): a Redis primary, a replica and three
  Sentinels of the test's own (``tests/redis_sentinel.py``), for failover tests.
- ``tls_sentinel_cluster`` (function): the same, TLS only on every link.
- ``tls_redis`` (function): a TLS-only redis-server requiring client
  certificates, and throwaway certificates made with openssl (``tests/redis_tls.py``).
- ``private_pg`` (function): a PostgreSQL cluster of the test's own, with
  ``restart()``, for outage tests.
- ``zookeeper_url`` (session): a ZooKeeper server (Debian's ``zookeeper``
  package, ``tests/brokers.py``) on a free loopback port,
  ``zookeeper://127.0.0.1:PORT``; ``FLOWENGINE_TEST_ZOOKEEPER_URL`` names an
  existing one instead. ``zk_hosts``: its ``host:port`` for kazoo.
- ``etcd_url`` (session): an etcd server (Debian's ``etcd-server``,
  ``tests/brokers.py``) on free loopback ports, ``etcd://127.0.0.1:PORT``;
  ``FLOWENGINE_TEST_ETCD_URL`` names an existing one instead.
- ``private_etcd`` (function): an etcd of the test's own, with ``kill()`` /
  ``start()`` / ``restart()`` (data kept), for outage tests.
- ``private_zookeeper`` (function): a ZooKeeper of the test's own, with
  ``kill()`` / ``start()`` / ``restart()`` (data kept), for outage tests.

Markers: ``broker`` (out of the fast tier: starts a server or a process, or
is slow; see tests/fast_tier.py), ``slow``. ``pytest -m "not broker"`` (``tox
-e unit``) runs the fast tier; with ``FLOWENGINE_NO_SERVERS=1`` a test of it
that starts a server or a process fails.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass, field

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # make `brokers` importable
import brokers  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)  # make `tests.persistence` importable

from tests import fast_tier  # noqa: E402
from tests.persistence import pg_server  # noqa: E402

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

# What commands remember between runs (the workers that answered the last
# `inspect`, flowengine/commands/known_workers.py) stays in this run: the
# user's ~/.cache is not touched and no earlier run shapes this one.
os.environ["FLOWENGINE_CACHE_DIR"] = tempfile.mkdtemp(prefix="flowengine-test-cache-")

try:
    from hypothesis import HealthCheck, settings

    # No per-example deadline: timings on a shared 2-core machine are noise.
    settings.register_profile(
        "flowengine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    # CI: the same examples every run (a red CI is then reproducible) and no
    # example database left in the clone.
    settings.register_profile(
        "ci",
        parent=settings.get_profile("flowengine"),
        derandomize=True,
        database=None,
        print_blob=True,
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if IN_CI else "flowengine"))
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass


@pytest.fixture(autouse=True)
def _shared_executors_closed():
    """Close the executors engines with ``shared=True`` left up for the next run.

    They outlive a run by design (30 s idle); left up, a later test of the
    same process would count their threads or read their queues.
    """
    yield
    sharing = sys.modules.get("flowengine.engines.worker_based.executor_side.sharing")
    if sharing is not None:
        sharing.POOL.close()


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """Remove the root handlers a test added and give the root level back.

    ``cli.main(["worker", ...])`` run in-process configures logging as a
    daemon does (a stderr handler, INFO): left as is, later tests would log
    to a captured stream pytest has closed. pytest's own capture handlers
    come and go with each test phase: they are left to pytest.
    """
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broker: out of the fast tier: starts a server (broker, database, ZooKeeper,"
        " etcd) or a process, or is slow (tests/fast_tier.py)",
    )
    config.addinivalue_line(
        "markers", "slow: takes half a second or more (waits on real timeouts, leases, retries)"
    )
    # Used at import time by tests/engines/conftest.py, before its own hooks run.
    config.addinivalue_line(
        "markers", "worker_processes: runs on `flowengine worker` processes over a broker"
    )
    config.pluginmanager.register(_GroupsInOneProcess(), "flowengine-xdist-groups")


def pytest_sessionstart(session: pytest.Session) -> None:
    # Not in pytest-xdist's controller: it starts its workers as Python
    # processes; each worker installs the guard for the tests it runs.
    config = session.config
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):
        return
    fast_tier.install()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``broker`` each test out of the fast tier, before -m selects (tests/fast_tier.py).

    A test is out when it uses a fixture of SERVER_FIXTURES, runs with a
    parameter of SERVER_PARAMETERS (an engine, board, backend or broker
    kind that starts a server or processes), or is marked ``slow``.
    """
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if (
            fast_tier.SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            or any(isinstance(v, str) and v in fast_tier.SERVER_PARAMETERS for v in params)
            or item.get_closest_marker("slow") is not None
        ):
            item.add_marker(pytest.mark.broker)


def _unavailable(reason: str) -> None:
    # Locally a missing broker is a skip with the reason; in CI it must fail,
    # so a broken install can never turn the broker tests green by skipping.
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def _session_broker(request: pytest.FixtureRequest, env_var: str, starter) -> str:
    url = os.environ.get(env_var)
    if url:
        return url
    fast_tier.refuse(f"a server ({starter.__name__})")
    try:
        proc = starter()
    except brokers.BrokerUnavailable as exc:
        reason = str(exc)
    else:
        request.addfinalizer(proc.stop)
        # Shown with -s or in a failing run's captured output; handy for CI timing.
        sys.stderr.write(f"\n[brokers] {proc.name} up at {proc.url} in {proc.start_time_s:.2f} s\n")
        return proc.url
    _unavailable(reason)  # outside `except`: no chained traceback in the report
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """URL of a redis-server running for this session (``redis://127.0.0.1:PORT/0``)."""
    return _session_broker(request, "FLOWENGINE_TEST_REDIS_URL", brokers.start_redis)


@pytest.fixture(scope="session")
def zookeeper_url(request: pytest.FixtureRequest) -> str:
    """URL of a ZooKeeper server running for this session (``zookeeper://127.0.0.1:PORT``)."""
    return _session_broker(request, "FLOWENGINE_TEST_ZOOKEEPER_URL", brokers.start_zookeeper)


@pytest.fixture(scope="session")
def etcd_url(request: pytest.FixtureRequest) -> str:
    """URL of an etcd server running for this session (``etcd://127.0.0.1:PORT``)."""
    return _session_broker(request, "FLOWENGINE_TEST_ETCD_URL", brokers.start_etcd)


@pytest.fixture(scope="session")
def zk_hosts(zookeeper_url: str) -> str:
    """``host:port`` of the session's ZooKeeper (kazoo's ``hosts``)."""
    return zookeeper_url.split("://", 1)[1].rstrip("/")


_PG_STATE: dict = {}


@pytest.fixture(scope="session")
def pg_url(request: pytest.FixtureRequest) -> str:
    """URL of a PostgreSQL server for this session (started once, stopped at the end).

    ``FLOWENGINE_TEST_PG_URL`` names an existing server instead. Shared by the
    persistence and command tests (one server per session).
    """
    url = os.environ.get("FLOWENGINE_TEST_PG_URL")
    if url:
        return url
    fast_tier.refuse("a PostgreSQL server")
    if "error" not in _PG_STATE and "server" not in _PG_STATE:
        try:
            server = pg_server.start()
        except pg_server.PgUnavailable as e:
            _PG_STATE["error"] = f"PostgreSQL test server unavailable: {e}"
        else:
            _PG_STATE["server"] = server
            request.addfinalizer(server.stop)
            sys.stderr.write(f"\n[postgresql] up at {server.url} in {server.start_time_s:.2f} s\n")
    if "error" in _PG_STATE:
        _unavailable(_PG_STATE["error"])
    return _PG_STATE["server"].url


@pytest.fixture(scope="session")
def amqp_url(request: pytest.FixtureRequest) -> str:
    """URL of a rabbitmq-server running for this session (``amqp://guest:guest@...//``)."""
    return _session_broker(request, "FLOWENGINE_TEST_AMQP_URL", brokers.start_rabbitmq)


def _private_broker(starter):
    fast_tier.refuse(f"a server of its own ({getattr(starter, '__name__', starter)})")
    try:
        return starter()
    except brokers.BrokerUnavailable as exc:
        reason = str(exc)
    _unavailable(reason)
    raise AssertionError("unreachable")


@pytest.fixture
def private_redis():
    """A redis-server of this test's own (``.url``, ``.kill()``, ``.start()``, ``.restart()``).

    For outage tests: ``kill()`` takes it down, ``start()`` brings it back on
    the same URL.  Stopped after the test.
    """
    proc = _private_broker(brokers.start_redis)
    yield proc
    proc.stop()


@pytest.fixture
def persistent_redis():
    """Like ``private_redis``, but what was written survives ``kill()`` (AOF, fsync always).

    For durable-topology and restart tests.
    """
    proc = _private_broker(functools.partial(brokers.start_redis, persistent=True))
    yield proc
    proc.stop()


@pytest.fixture
def sentinel_cluster():
    """A Redis primary + replica + three Sentinels of this test's own (``tests/redis_sentinel.py``).

    ``.board_conf()`` gives TaskFlow's keys reaching the master through the
    Sentinels; ``.kill_master()`` / ``.wait_for_new_master()`` for failover
    tests. About 2 s to start; stopped after the test.
    """
    import redis_sentinel

    cluster = _private_broker(redis_sentinel.start_cluster)
    yield cluster
    cluster.stop()


@pytest.fixture
def tls_sentinel_cluster(tmp_path):
    """``sentinel_cluster`` speaking TLS only on every link, with client certificates.

    ``.tls`` holds the certificates (made with openssl, ``tests/redis_tls.py``);
    ``.board_conf()`` then carries TaskFlow's ssl keys and ``sentinel_kwargs``.
    """
    import redis_sentinel
    import redis_tls

    cluster = _private_broker(
        lambda: redis_sentinel.start_cluster(redis_tls.make_certificates(tmp_path))
    )
    yield cluster
    cluster.stop()


@pytest.fixture
def tls_redis(tmp_path):
    """``(certificates, server)``: a TLS-only redis-server requiring client certificates.

    Certificates (CA, server, client, and a CA that signed nothing) are made
    with openssl in the test's tmp_path (``tests/redis_tls.py``).
    """
    import redis_tls

    def start():
        certs = redis_tls.make_certificates(tmp_path)
        return certs, redis_tls.start_tls_redis(certs, auth_clients=True)

    certs, server = _private_broker(start)
    yield certs, server
    server.stop()


@pytest.fixture
def private_rabbitmq():
    """A rabbitmq-server of this test's own (~5 s to start); see ``private_redis``."""
    proc = _private_broker(brokers.start_rabbitmq)
    yield proc
    proc.stop()


@pytest.fixture
def private_zookeeper():
    """A ZooKeeper of this test's own (``.url``, ``.kill()``, ``.start()``, ``.restart()``).

    Its data directory survives ``kill()``, so a restart keeps every znode.
    """
    proc = _private_broker(brokers.start_zookeeper)
    yield proc
    proc.stop()


@pytest.fixture
def private_etcd():
    """An etcd of this test's own (``.url``, ``.kill()``, ``.start()``, ``.restart()``).

    Its data directory survives ``kill()``, so a restart keeps every key and lease.
    """
    proc = _private_broker(brokers.start_etcd)
    yield proc
    proc.stop()


@pytest.fixture
def private_pg():
    """A PostgreSQL cluster of this test's own (``.url``, ``.restart()``), for outage tests.

    Durable: a commit that returned survives the crash restart() makes.
    """
    fast_tier.refuse("a PostgreSQL server of its own")
    try:
        server = pg_server.start(durable=True)
    except pg_server.PgUnavailable as e:
        reason = f"PostgreSQL test server unavailable: {e}"
    else:
        yield server
        server.stop()
        return
    _unavailable(reason)


@dataclass
class Broker:
    """Where a test's kombu connections go: kind, URL and transport options."""

    kind: str
    url: str
    transport_options: dict = field(default_factory=dict)


BROKER_KINDS = [
    "memory",
    "filesystem",
    pytest.param("redis", marks=pytest.mark.broker),
    pytest.param("amqp", marks=pytest.mark.broker),
]


@pytest.fixture(params=BROKER_KINDS)
def broker(request: pytest.FixtureRequest, tmp_path) -> Broker:
    """One of memory / filesystem (temp folder) / redis / amqp, per parameter."""
    kind = request.param
    if kind == "memory":
        return Broker(kind, "memory://")
    if kind == "filesystem":
        folder = tmp_path / "broker"
        folder.mkdir()
        # One folder for in and out: every producer and consumer shares it.
        return Broker(
            kind,
            "filesystem://",
            {
                "data_folder_in": str(folder),
                "data_folder_out": str(folder),
                "store_processed": False,
            },
        )
    if kind == "redis":
        return Broker(kind, request.getfixturevalue("redis_url"))
    return Broker(kind, request.getfixturevalue("amqp_url"))


@pytest.fixture
def broker_url(broker: Broker) -> str:
    """The URL of the parametrised ``broker`` (memory/filesystem/redis/amqp)."""
    return broker.url


@pytest.fixture
def unique_name() -> str:
    """A fresh name (exchange, topic) so tests on a shared broker never collide."""
    return f"fe-test-{uuid.uuid4().hex[:12]}"


class _GroupsInOneProcess:
    """Keep the tests of one ``xdist_group`` in one process (``--dist loadgroup``).

    A group shares a cluster its tests start (3 RabbitMQ nodes, a ZooKeeper
    ensemble, Redis Sentinels): split across processes, each starts its own.
    pytest-xdist 3.8 marks a grouped test by setting ``item._nodeid`` (its id
    plus ``@group``), which pytest 9 no longer reads (it keeps the id in
    ``item._id``), so the groups were spread over both processes. The suffix
    is put where pytest reads it; where xdist already did, nothing changes.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not getattr(config.option, "loadgroup", False):
            return
        try:
            from _pytest.nodeid import NodeId
        except ImportError:  # a pytest before 9: xdist's own marking works there
            return
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            if mark is None or "@" in item.nodeid or not hasattr(item, "_id"):
                continue
            item._id = NodeId.parse(f"{item.nodeid}@{mark.args[0]}")
