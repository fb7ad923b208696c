"""Put back messages a Redis restart stranded between delivery and acknowledgement.

kombu's Redis transport emulates acknowledgements: a delivered message is
parked in an ``unacked`` hash until it is acknowledged, and only put back in
its queue after ``visibility_timeout`` (an hour by default). When Redis
restarts (with persistence on) every connection breaks, so a message that was
delivered but not yet acknowledged at that moment is parked for an hour while
nobody will ever acknowledge it: for a flow, a lost request or reply.

After reconnecting, a proxy calls :func:`restore_stranded`: if Redis itself
restarted during the proxy's outage, every message parked before the restart
is put back at the head of its queue now. A message parked after the restart
belongs to a live consumer and is left alone.

Where "before the restart" ends is taken from a marker, not from Redis's
uptime: Redis reports ``uptime_in_seconds`` from a start time cut to the
second, so ``now - uptime`` may fall up to a second after the restart (a
message parked just before it would be left stranded) or before it. Every
consumer, on each connection, stamps the Redis run it sees with its host's
clock (the one kombu scores parked messages with) if nobody did (``SET
NX``); as each consumes only after that, a message parked in this run
carries a later score than the stamp, and one parked in an earlier run an
earlier one. Other transports need nothing
(AMQP brokers requeue unacknowledged messages when a connection closes), and
flowengine's own Redis transport (the default for ``redis://``) puts back
what a consumer held by itself (transports/redis.py): this module serves
users who chose kombu's transport by its dotted path.
"""

from __future__ import annotations

import logging
from typing import Any

from flowengine.engines.worker_based.wire import clock

LOG = logging.getLogger(__name__)

#: Most parked messages put back by one call: bounds the work done while the
#: consume loop is not consuming yet (more are put back on the next outage,
#: or by kombu itself after visibility_timeout).
MAX_RESTORED = 10_000

#: Seconds a run's first-seen stamp is kept: it only matters to consumers
#: reconnecting after that run began; later ones fall back on the uptime.
RUN_STAMP_TTL_S = 7 * 24 * 3600

#: Redis cuts its start time to the second: the uptime fallback stops this
#: much earlier, so it never takes a message of the new run for a stranded one.
UPTIME_RESOLUTION_S = 1.0


def run_stamp_key(run_id: str) -> str:
    """The Redis key holding when consumers first saw Redis run ``run_id``."""
    return f"_flowengine.redis-run-first-seen.{run_id}"


def _redis_channel(conn: Any) -> Any | None:
    """The connection's channel if it is kombu's Redis channel, else None."""
    if getattr(conn.transport, "driver_type", None) != "redis":
        # Asked on every consumer start: other brokers (AMQP) would pay a
        # channel opened for nothing, one round trip.
        return None
    channel = conn.default_channel
    if all(
        hasattr(channel, attr) for attr in ("unacked_index_key", "unacked_key", "qos", "client")
    ):
        return channel
    return None


def broker_run_id(conn: Any) -> str | None:
    """Redis's ``run_id`` (new on every start) for a connected ``conn``; None off Redis.

    Also stamps the run with this process's clock if no consumer did yet:
    call it before consuming on each connection (see the module docstring).
    """
    try:
        channel = _redis_channel(conn)
        if channel is None:
            return None
        client = channel.client
        run_id = str(client.info("server")["run_id"])
        client.set(run_stamp_key(run_id), repr(clock.host_wall()), nx=True, ex=RUN_STAMP_TTL_S)
        return run_id
    except Exception:
        LOG.debug("Could not read the Redis run_id", exc_info=True)
        return None


def restore_stranded(conn: Any, previous_run_id: str | None) -> int:
    """After an outage, put back what a Redis restart stranded.

    ``previous_run_id`` is the run_id seen before the outage: only if Redis
    has another one now did it restart. Returns how many messages were put
    back (0 for other transports, or when Redis did not restart). Errors are
    logged, never raised: the caller is reconnecting and must go on consuming.
    """
    try:
        channel = _redis_channel(conn)
        if channel is None or previous_run_id is None:
            return 0
        client = channel.client
        info = client.info("server")
        if str(info["run_id"]) == previous_run_id:
            return 0  # our connection broke but Redis kept running: nothing stranded
        uptime_s = float(info["uptime_in_seconds"])
        stamp = client.get(run_stamp_key(str(info["run_id"])))
        if stamp is not None:
            ceil = float(stamp)
        else:  # stamp expired, or no consumer connected since: Redis's own word
            ceil = clock.host_wall() - uptime_s - UPTIME_RESOLUTION_S
        tags = client.zrangebyscore(channel.unacked_index_key, 0, ceil, start=0, num=MAX_RESTORED)
        for tag in tags:
            # A transaction per tag: a tag another consumer restored meanwhile
            # is found gone and only unindexed, never put back twice.
            channel.qos.restore_by_tag(tag, client, leftmost=True)
        if tags:
            LOG.warning(
                "Redis restarted %.0f s ago: putting back %d message(s) delivered"
                " before the restart and never acknowledged (another consumer"
                " may have put some back already)",
                uptime_s,
                len(tags),
            )
        return len(tags)
    except Exception:
        LOG.warning("Could not check for messages stranded by a Redis restart", exc_info=True)
        return 0
