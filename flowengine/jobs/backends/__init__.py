"""Find and build jobboards by name (TaskFlow's ``taskflow.jobs.backends``).

``fetch('my-board', {'board': 'redis', 'host': ..., 'namespace': ...})`` or
``fetch('my-board', 'redis://127.0.0.1:6379?namespace=x')``: the ``board``
key (or the URL's scheme) names the backend, the rest of the configuration
is the backend's. Backends are looked up in the entry point group
``namespace`` first, then in a built-in table (so a source checkout works).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from flowengine.utils import misc, plugins

__all__ = ["BACKEND_NAMESPACE", "backend", "fetch", "safe_url"]

LOG = logging.getLogger(__name__)

#: Entry point group searched for jobboard classes.
BACKEND_NAMESPACE = "flowengine.jobboards"

_BUILTIN = {
    "memory": "flowengine.jobs.backends.impl_memory:MemoryJobBoard",
    "redis": "flowengine.jobs.backends.impl_redis:RedisJobBoard",
    "rediss": "flowengine.jobs.backends.impl_redis:RedisJobBoard",
    "sqlite": "flowengine.jobs.backends.impl_sqlalchemy:SQLJobBoard",
    "postgresql": "flowengine.jobs.backends.impl_sqlalchemy:SQLJobBoard",
    "zookeeper": "flowengine.jobs.backends.impl_zookeeper:ZookeeperJobBoard",
    "etcd": "flowengine.jobs.backends.impl_etcd:EtcdJobBoard",
}
# Backends whose URL is the whole connection string (not merged into keys).
_URL_IS_CONNECTION = ("sqlite", "postgresql")
# Backends that read their URL themselves (zookeeper://h1:p1,h2:p2/path is no
# single host and port).
_URL_READ_BY_BOARD = ("zookeeper",)


#: ``url`` with any password replaced by ``***`` (for logs and errors).
safe_url = misc.mask_password


def _name_and_conf(conf: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if isinstance(conf, str):
        conf = {"board": conf}
    elif isinstance(conf, dict):
        conf = dict(conf)
    else:
        raise TypeError(
            f"Jobboard configuration must be a URL string or a dict, not {type(conf).__name__}"
        )
    board = conf.get("board")
    if not isinstance(board, str) or not board:
        raise ValueError(
            f"Jobboard configuration needs a 'board' key naming the backend"
            f" (memory, redis, sqlite, postgresql, zookeeper, etcd): {sorted(conf)}"
        )
    try:
        uri = misc.parse_uri(board)
    except ValueError:
        return board.lower(), conf
    name = uri.scheme.lower().split("+", 1)[0]
    if name in _URL_READ_BY_BOARD:
        conf.setdefault("url", board)
    elif name in _URL_IS_CONNECTION:
        conf.setdefault("connection", board)
        for key, value in misc.merge_uri(uri._replace(netloc="", path=""), {}).items():
            conf.setdefault(key, value)
    else:
        conf.setdefault("url", board)
        misc.merge_uri(uri, conf)
    return name, conf


def _find_class(name: str, namespace: str) -> Any:
    builtin = _BUILTIN if namespace == BACKEND_NAMESPACE else {}
    return plugins.find_class(name, namespace, builtin, "jobboard")


def fetch(
    name: str, conf: str | dict[str, Any], namespace: str = BACKEND_NAMESPACE, **kwargs: Any
) -> Any:
    """Build the jobboard ``conf`` names (not connected yet).

    ``kwargs`` go to the board (``persistence=``, ``client=``...). Raises
    NotFound for an unknown backend, ValueError for a bad configuration.
    """
    board, conf = _name_and_conf(conf)
    LOG.debug("Looking for %r jobboard driver in %r", board, namespace)
    return _find_class(board, namespace)(name, conf, **kwargs)


@contextlib.contextmanager
def backend(
    name: str, conf: str | dict[str, Any], namespace: str = BACKEND_NAMESPACE, **kwargs: Any
) -> Iterator[Any]:
    """Fetch a jobboard, connect it, yield it, close it afterwards."""
    board = fetch(name, conf, namespace=namespace, **kwargs)
    board.connect()
    with contextlib.closing(board):
        yield board
