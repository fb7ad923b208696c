"""Writes that count as done once a replica has them: what a Redis failover cannot lose.

Redis replicates asynchronously: it answers a write before any replica has
it, and a master killed a moment later takes the write with it when
Sentinel promotes the replica. For flowengine's transport that moment can
cost a request (an engine's publication gone: no worker ever sees it, and
its engine would only learn of it at its transition timeout) or, worse,
a second run of one (a worker's take and acceptance gone: the request is
back in its queue on the new master while the first worker runs it); for
the Redis jobboard, a job posted, or a claim (another conductor claims the
job again while the first runs it).

:func:`replicated` makes server-side scripts (the transport's that publish
and settle, all of the board's) wait for ``replicas`` replicas (``WAIT``,
sent in the same round trip, on the same connection, as the script): a
write is only reported done once a replica has it, and Sentinel promotes
the replica with the most data, so a failover no longer takes it away.

When no replica acknowledges within ``timeout_ms`` (none is attached, e.g.
right after a failover promoted the only one) the write stands on the
master alone, as without waiting: a warning says so, and writes stop
waiting for PAUSE_AFTER_SHORT_S, so that a cluster without replicas pays
the timeout once per pause instead of on every write. The channels of one
process share that pause (:func:`shared`): they reach the same servers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_exc

LOG = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "PAUSE_AFTER_SHORT_S",
    "REPLICAS_OPTION",
    "TIMEOUT_OPTION",
    "ReplicaWait",
    "replicated",
    "shared",
]

#: Transport option: replicas a publication or settlement must reach before
#: it counts as done (0: do not wait). The Sentinel transport waits for 1 by
#: default, ``redis://`` for none. (The board's key: ``wait_replicas``.)
REPLICAS_OPTION = "flowengine_wait_replicas"

#: Transport option: the longest wait (s) for those replicas per write
#: (the board's key: ``wait_replicas_timeout_s``).
TIMEOUT_OPTION = "flowengine_wait_replicas_timeout_s"

#: A replica on the same network acknowledges within milliseconds; one that
#: takes longer than this is lagging or gone, and the write goes on without it.
DEFAULT_TIMEOUT_S = 0.5

#: After a write no replica acknowledged in time, writes stop waiting for
#: this long (s): a cluster that lost its replicas pays one timeout per pause.
PAUSE_AFTER_SHORT_S = 10.0


class ReplicaWait:
    """How many replicas a write must reach, and for how long to wait for them.

    Shared by the clients of one channel; thread-safe.
    """

    def __init__(self, replicas: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.replicas = replicas
        self.timeout_ms = max(1, int(timeout_s * 1000))
        self._paused_until = 0.0
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether writes wait for replicas now (configured, and not paused)."""
        return self.replicas > 0 and time.monotonic() >= self._paused_until

    def short(self, acked: int, where: str) -> None:
        """A write reached only ``acked`` replicas in time: warn and pause waiting."""
        with self._lock:
            if time.monotonic() < self._paused_until:
                return
            self._paused_until = time.monotonic() + PAUSE_AFTER_SHORT_S
        LOG.warning(
            "Redis at %s: a write reached %d of %d replica(s) within %.2f s; it"
            " stands on the master alone (a failover now could lose it); writes do"
            " not wait for replicas for the next %.0f s",
            where,
            acked,
            self.replicas,
            self.timeout_ms / 1000,
            PAUSE_AFTER_SHORT_S,
        )


_SHARED: dict[tuple[str, int, float], ReplicaWait] = {}
_SHARED_LOCK = threading.Lock()


def shared(where: str, replicas: int, timeout_s: float) -> ReplicaWait:
    """The process's ReplicaWait for the server(s) at ``where`` with these settings."""
    key = (where, replicas, timeout_s)
    with _SHARED_LOCK:
        wait = _SHARED.get(key)
        if wait is None:
            wait = _SHARED[key] = ReplicaWait(replicas, timeout_s)
        return wait


class _ReplicatedScript:
    """A server-side script whose call returns once the write reached the replicas."""

    def __init__(self, owner: _ReplicatedClient, script: Any) -> None:
        self._owner = owner
        self._script = script

    def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None
    ) -> Any:
        owner = self._owner
        wait = owner.wait
        if not wait.active:
            return self._script(keys=keys, args=args)
        for _ in range(2):  # a second time after loading the script (NOSCRIPT)
            # One pipeline: one connection, so WAIT covers exactly this write,
            # and one round trip.
            with owner.client.pipeline(transaction=False) as pipe:
                pipe.execute_command("EVALSHA", self._script.sha, len(keys), *keys, *args)
                pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
                result, acked = pipe.execute(raise_on_error=False)
            if isinstance(result, redis_exc.NoScriptError):
                owner.client.script_load(self._script.script)
                continue
            if isinstance(result, Exception):
                raise result
            if isinstance(acked, Exception) or int(acked) < wait.replicas:
                wait.short(0 if isinstance(acked, Exception) else int(acked), owner.where)
            return result
        raise redis_exc.NoScriptError("script not kept by the server after SCRIPT LOAD")


class _ReplicatedClient:
    """A redis-py client whose registered scripts wait for replicas (see the module doc).

    Every other command goes to the wrapped client unchanged.
    """

    def __init__(self, client: Any, wait: ReplicaWait, where: str) -> None:
        self.client = client
        self.wait = wait
        self.where = where

    def register_script(self, text: str) -> _ReplicatedScript:
        return _ReplicatedScript(self, self.client.register_script(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def replicated(client: Any, wait: ReplicaWait | None, where: str) -> Any:
    """``client``, its script calls waiting for replicas when ``wait`` asks for any.

    The wrapper is kept on the client: its scripts are registered once.
    """
    if wait is None or wait.replicas <= 0:
        return client
    wrapped = client.__dict__.get("_flowengine_replicated")
    if wrapped is None or wrapped.wait is not wait:
        wrapped = client.__dict__["_flowengine_replicated"] = _ReplicatedClient(client, wait, where)
    return wrapped
