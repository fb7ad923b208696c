"""Find and build persistence backends by name or connection URL.

``fetch('memory://')`` or ``fetch({'connection': 'memory://', ...})``.
Backends are looked up in the entry point group ``namespace`` first, then
in a built-in table, so local backends work without installed metadata.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any
from urllib import parse

from flowengine.persistence import base
from flowengine.utils import plugins

__all__ = ["BACKEND_NAMESPACE", "backend", "fetch"]

LOG = logging.getLogger(__name__)

#: Entry point group searched for backend classes.
BACKEND_NAMESPACE = "flowengine.persistence"

# Built-in backends: name -> "module:Class" (modules may arrive in later releases).
_BUILTIN_BACKENDS = {
    "memory": "flowengine.persistence.backends.impl_memory:MemoryBackend",
    "dir": "flowengine.persistence.backends.impl_dir:DirBackend",
    "file": "flowengine.persistence.backends.impl_dir:DirBackend",
    "sqlite": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
    "mysql": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
    "postgresql": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
    "zookeeper": "flowengine.persistence.backends.impl_zookeeper:ZkBackend",
}


def _extract_name_and_conf(conf: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if isinstance(conf, str):
        conf = {"connection": conf}
    elif not isinstance(conf, dict):
        raise TypeError(
            f"Backend configuration must be a string or a dict, not {type(conf).__name__}"
        )
    else:
        conf = dict(conf)
    try:
        uri = conf["connection"]
    except KeyError:
        raise ValueError(f"Backend configuration needs a 'connection' key: {conf!r}")
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"Backend 'connection' must be a non-empty string: {uri!r}")
    if "://" not in uri:
        # 'memory', or TaskFlow's 'memory:' / 'dir:' (a scheme, nothing after it).
        return uri.split(":", 1)[0].lower(), conf
    parsed = parse.urlsplit(uri)
    # Query parameters (memory://?deep_copy=...) fill in unset options.
    for key, values in parse.parse_qs(parsed.query).items():
        conf.setdefault(key, values[-1])
    name = parsed.scheme.lower()
    # 'mysql+pymysql' names a dialect of the 'mysql' backend.
    return name.split("+", 1)[0], conf


def _find_class(name: str, namespace: str) -> type[base.Backend]:
    builtin = _BUILTIN_BACKENDS if namespace == BACKEND_NAMESPACE else {}
    backend_cls: type[base.Backend] = plugins.find_class(name, namespace, builtin, "backend")
    return backend_cls


def fetch(
    conf: str | dict[str, Any], namespace: str = BACKEND_NAMESPACE, **kwargs: Any
) -> base.Backend:
    """Build the backend named by ``conf`` (URL string or dict with 'connection').

    Raises NotFound when no backend of that name exists.
    """
    name, conf = _extract_name_and_conf(conf)
    LOG.debug("Looking for %r backend driver in %r", name, namespace)
    cls = _find_class(name, namespace)
    return cls(conf, **kwargs)


@contextlib.contextmanager
def backend(
    conf: str | dict[str, Any], namespace: str = BACKEND_NAMESPACE, **kwargs: Any
) -> Iterator[base.Backend]:
    """Fetch a backend, upgrade its structure, yield it and close it afterwards."""
    be = fetch(conf, namespace=namespace, **kwargs)
    try:
        with contextlib.closing(be.get_connection()) as conn:
            conn.upgrade()
        yield be
    finally:
        be.close()
