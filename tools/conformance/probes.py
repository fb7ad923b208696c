"""Honest answers to TaskFlow's test-environment probes.

Copied into each conformance work tree as ``tfconformance/probes.py``; the
rewritten ``tfconformance/tests/utils.py`` imports its probe functions, and
tests that asked ``taskflow.utils.eventlet_utils`` ask this module instead.
A probe says yes only when the service really answers on this machine.
"""

from __future__ import annotations

import functools
import importlib.util
import os

# TaskFlow's tests read these variables (the URL one keeps TaskFlow's spelling);
# read when a probe runs, so a runner that starts servers can set them first.
_URL_ENV = "TAKSFLOW_TEST_URL"


def _port(variable: str, default: int) -> int:
    return int(os.getenv(variable, str(default)))


# A server on localhost answers within this, or it is taken as absent.
PROBE_TIMEOUT_S = 2.0

EVENTLET_AVAILABLE = importlib.util.find_spec("eventlet") is not None


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


@functools.lru_cache
def zookeeper_available(min_version, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True iff a ZooKeeper server at least *min_version* answers on localhost."""
    url = os.getenv(_URL_ENV)
    if url is not None:
        return url.startswith("zookeeper://")
    if not _installed("kazoo"):
        return False
    from kazoo.client import KazooClient

    client = KazooClient(
        hosts=f"localhost:{_port('TASKFLOW_TEST_ZOOKEEPER_PORT', 2181)}", timeout=PROBE_TIMEOUT_S
    )
    try:
        client.start(timeout=min(float(timeout), PROBE_TIMEOUT_S))
        return not min_version or tuple(client.server_version()) >= tuple(min_version)
    except Exception:
        return False
    finally:
        client.stop()
        client.close()


@functools.lru_cache
def redis_available(min_version) -> bool:
    """True iff a Redis server at least *min_version* answers on localhost."""
    url = os.getenv(_URL_ENV)
    if url is not None:
        return url.startswith("redis://")
    if not _installed("redis"):
        return False
    import redis

    client = redis.Redis(
        port=_port("TASKFLOW_TEST_REDIS_PORT", 6379),
        socket_timeout=PROBE_TIMEOUT_S,
        socket_connect_timeout=PROBE_TIMEOUT_S,
    )
    try:
        version = client.info("server")["redis_version"]
    except Exception:
        return False
    finally:
        client.close()
    return _version_tuple(version) >= _version_tuple(str(min_version or "0"))


@functools.lru_cache
def etcd_available() -> bool:
    """True iff an etcd server answers on localhost."""
    url = os.getenv(_URL_ENV)
    if url is not None:
        return url.startswith("etcd://")
    if not _installed("etcd3gw"):
        return False
    import etcd3gw

    try:
        etcd3gw.Etcd3Client(
            port=_port("TASKFLOW_TEST_ETCD_PORT", 2379), timeout=PROBE_TIMEOUT_S
        ).get("/")
    except Exception:
        return False
    return True


class Missing:
    """Stands for a module the engine under test lacks; using it raises the ImportError.

    Attribute access gives another placeholder (so module-level expressions
    such as ``impl_zookeeper.ZookeeperJobBoard.MIN_ZK_VERSION`` still
    evaluate); calling it, iterating it or subclassing it raises.
    """

    def __init__(self, name: str, error: ImportError) -> None:
        self._name = name
        self._error = error

    def __getattr__(self, attribute: str) -> Missing:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return Missing(f"{self._name}.{attribute}", self._error)

    def _fail(self, *args, **kwargs):
        raise ImportError(f"{self._name} is unavailable: {self._error}") from self._error

    __call__ = _fail
    __iter__ = _fail

    def __mro_entries__(self, bases):
        return (_missing_base(self),)

    def __repr__(self) -> str:
        return f"<missing {self._name}>"


def _missing_base(placeholder: Missing) -> type:
    class MissingBase:
        def setUp(self):  # noqa: N802 - unittest's name
            placeholder._fail()

    return MissingBase


def missing(name: str, error: ImportError) -> Missing:
    """The placeholder bound to *name* when its import failed with *error*."""
    return Missing(name, error)
