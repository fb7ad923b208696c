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
"""

from __future__ import annotations

import functools
from typing import Any

import redis

from flowengine import __version__

__all__ = ["connection_kwargs"]


@functools.cache
def connection_kwargs() -> dict[str, Any]:
    """Keyword arguments for a redis-py connection (pool or client): its driver identity."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py before DriverInfo: nothing to add
        return {}
    info = DriverInfo(lib_version=redis.__version__)
    try:
        info.add_upstream_driver("flowengine", __version__)
    except ValueError:  # a local version string redis-py refuses: plain redis-py then
        pass
    return {"driver_info": info}
