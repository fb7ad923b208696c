"""How flowengine's Redis connections introduce themselves to the server.

On connecting, redis-py tells the server its name and version (``CLIENT
SETINFO``; shown by ``CLIENT LIST``). Versions of redis-py that describe
this with a ``DriverInfo`` work the version out for every new connection
from the installed package's metadata, unless given one: about a
millisecond of CPU per connection, and an engine opens several connections
in each ``run()`` (its reply consumer's channels, its publisher), which made
a one-task Redis ``run()`` a fifth slower. :func:`connection_kwargs` gives
them one ``DriverInfo``, made once per process, that also names flowengine
as the library on top (``redis-py(flowengine_v1.2.3)``), as redis-py asks of
libraries built on it. Older redis-py versions read their version once, at
import, and get nothing extra.

They also speak RESP2: redis-py 8 speaks RESP3 unless told otherwise, which
costs every new connection two round trips before its first command
(``HELLO 3``, and the maintenance-notifications handshake after it);
nothing in flowengine needs RESP3. redis-py before 5.0 speaks only RESP2
and takes no ``protocol``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import redis
import redis.connection

from flowengine import __version__

__all__ = ["connection_kwargs"]


@functools.cache
def connection_kwargs() -> dict[str, Any]:
    """Keyword arguments for a redis-py connection (pool or client): RESP2, its driver identity."""
    base = getattr(redis.connection, "AbstractConnection", redis.connection.Connection)
    kwargs: dict[str, Any] = (
        {"protocol": 2} if "protocol" in inspect.signature(base.__init__).parameters else {}
    )
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py before DriverInfo: no identity to add
        return kwargs
    info = DriverInfo(lib_version=redis.__version__)
    try:
        info.add_upstream_driver("flowengine", __version__)
    except ValueError:  # a local version string redis-py refuses: plain redis-py then
        pass
    return {**kwargs, "driver_info": info}
