"""What each consumer holds in Redis, its lease, and how a dead consumer's holdings come back.

flowengine's Redis transport never pops a message into thin air: a consumer
moves it (``BLMOVE``, atomic on the server) from its queue into an *in-flight*
list of its own, and removes it from there only when it settles it. A
consumer keeps a *lease* key alive while its process lives; the in-flight
lists of a consumer whose lease has lapsed are moved back to the head of
their queues by any live consumer (``reclaim``), and its private queues are
deleted (kombu's Redis transport never deletes a non-fanout queue).

Keys, all under ``flowengine.consumer.<id>.``: ``lease`` (string with a TTL),
``suspect`` (server time, ms, a live consumer first saw the lease missing),
``queues`` (set: queues with an in-flight list), ``inflight.<queue>`` (list),
``private`` (set: queues deleted with the consumer) and ``bindings`` (set:
``<binding set key>\\0<member>`` entries removed with it). The hash
``flowengine.consumers`` maps every registered consumer to its lease (ms).

A lease missing once may be a Redis restart that dropped it while its owner
reconnects, so a consumer is reclaimed only when its lease has been seen
missing for a whole lease period: reclaim comes about two lease periods
after a consumer's last renewal. A reclaimed consumer's bookkeeping sets
are kept for a day (not its private queues): one that was only frozen finds
them again when it renews, learns it was reclaimed (renew says so) and
declares its queues again; what it takes meanwhile can still be reclaimed.

Settling is fenced by a nonce drawn when the message was taken: a settle
retried after a lost answer recognises its own earlier success, while a
frozen holder whose message went to another consumer (same delivery tag,
same bytes) is refused. So is a second copy of a message in its queue (a
publication sent again after its answer was lost with a failed-over
master: publishers keep the delivery tag when they send again): the first
consumer to settle a copy wins, the others' copies are settled away unhandled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

# The transport options below live here, not in redis.py, so that code which
# only sets them (the proxy) does not import kombu's Redis transport and the
# Redis client: a user of the other transports needs neither.

#: Transport option: id under which this process holds messages (a worker's
#: id; unique per process). A random one per channel when absent.
CONSUMER_OPTION = "flowengine_consumer"

#: Transport option: the consumer's lease in seconds (see LeaseKeeper).
LEASE_OPTION = "flowengine_lease_s"

#: Lease (s) of a consumer nobody configured: two seconds of heartbeat
#: interval times three misses, as for requests (liveness.py).
DEFAULT_LEASE_S = 6.0

#: Hash of every registered consumer id -> its lease (ms).
REGISTRY_KEY = "flowengine.consumers"

#: Prefix of every per-consumer key.
CONSUMER_PREFIX = "flowengine.consumer."

#: How long (ms) a settle token says "this delivery was settled by its
#: holder": a settle retried after a lost reply finds it instead of failing.
SETTLE_TOKEN_TTL_MS = 120_000

#: Extra life (ms) of a suspect mark beyond two lease periods: a mark that
#: lapses before anybody looks again only delays a reclaim, never hastens it.
SUSPECT_EXTRA_MS = 10_000

#: How long (ms) a reclaimed consumer's bookkeeping sets outlive it: enough
#: for any frozen process to wake and find them; a dead one's then expire.
RECLAIMED_KEEP_MS = 86_400_000


#: kombu's separator of the fields of a binding (routing key, pattern, queue)
#: in an exchange's binding set ``_kombu.binding.<exchange>``.
BINDING_SEP = "\x06\x16"


class Push(NamedTuple):
    """One message for Redis to push: to the queues of ``bindings`` bound with ``key``.

    ``bindings`` is a direct exchange's binding set (kombu's layout); empty:
    ``key`` is the queue itself. Routing on the server saves the round trip
    kombu spends looking the bindings up first, and makes lookup and push one
    atomic step.
    """

    bindings: str
    key: str
    payload: str | bytes


def lease_key(consumer: str) -> str:
    """Key that exists while ``consumer`` is alive."""
    return f"{CONSUMER_PREFIX}{consumer}.lease"


def inflight_key(consumer: str, queue: str) -> str:
    """List of messages ``consumer`` took from ``queue`` and has not settled."""
    return f"{CONSUMER_PREFIX}{consumer}.inflight.{queue}"


def settle_token_key(delivery_tag: str, queue: str = "") -> str:
    """Key saying that the delivery ``delivery_tag`` from ``queue`` was settled by its holder.

    Per queue: a message routed to several queues (a broadcast) is settled
    once in each.
    """
    return (
        f"flowengine.settled.{queue}.{delivery_tag}"
        if queue
        else f"flowengine.settled.{delivery_tag}"
    )


# Shared by the scripts below: put back everything consumer ``c`` holds and
# delete what it owned; its bookkeeping sets expire after ``keep`` ms (0:
# deleted now). Returns how many messages went back.
_RECLAIM_FN = """
local P = 'flowengine.consumer.'
local SETS = {'.queues', '.bindings', '.private'}
local function reclaim(c, keep)
  local base = P .. c
  local n = 0
  for _, q in ipairs(redis.call('SMEMBERS', base .. '.queues')) do
    local key = base .. '.inflight.' .. q
    while redis.call('LMOVE', key, q, 'LEFT', 'RIGHT') do n = n + 1 end
  end
  for _, e in ipairs(redis.call('SMEMBERS', base .. '.bindings')) do
    local i = string.find(e, '\\0', 1, true)
    if i then redis.call('SREM', string.sub(e, 1, i - 1), string.sub(e, i + 1)) end
  end
  for _, q in ipairs(redis.call('SMEMBERS', base .. '.private')) do
    redis.call('DEL', q)
  end
  for _, suffix in ipairs(SETS) do
    if keep > 0 then
      redis.call('PEXPIRE', base .. suffix, keep)
    else
      redis.call('DEL', base .. suffix)
    end
  end
  redis.call('DEL', base .. '.suspect', base .. '.lease')
  redis.call('HDEL', 'flowengine.consumers', c)
  return n
end
local function register(me, lease)
  local base = P .. me
  redis.call('SET', base .. '.lease', '1', 'PX', lease)
  for _, suffix in ipairs(SETS) do redis.call('PERSIST', base .. suffix) end
  return redis.call('HSET', 'flowengine.consumers', me, lease)
end
"""

# ARGV: me, lease (ms), '1' to also reclaim dead consumers, suspect extra
# (ms), keep (ms). Returns {messages of dead consumers put back, 1 if ``me``
# was not registered (new, or reclaimed meanwhile)}.
_RENEW = (
    _RECLAIM_FN
    + """
local me, lease = ARGV[1], tonumber(ARGV[2])
local fresh = register(me, lease)
if ARGV[3] ~= '1' then return {0, fresh} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local extra, keep = tonumber(ARGV[4]), tonumber(ARGV[5])
local n = 0
local reg = redis.call('HGETALL', 'flowengine.consumers')
for i = 1, #reg, 2 do
  local c, grace = reg[i], tonumber(reg[i + 1]) or lease
  if c ~= me then
    local base = P .. c
    if redis.call('EXISTS', base .. '.lease') == 1 then
      redis.call('DEL', base .. '.suspect')
    else
      local since = tonumber(redis.call('GET', base .. '.suspect'))
      if not since then
        redis.call('SET', base .. '.suspect', now, 'PX', 2 * grace + extra)
      elseif now - since >= grace then
        n = n + reclaim(c, keep)
      end
    end
  end
end
return {n, fresh}
"""
)

# ARGV: consumer, keep (ms). Put back all it holds, delete its private
# queues, unregister it (keep 0: a consumer leaving; else: a dead one).
_RECLAIM = (
    _RECLAIM_FN
    + """
return reclaim(ARGV[1], tonumber(ARGV[2]))
"""
)

# ARGV: me, queue, lease (ms). Registers ``queue`` as one ``me`` takes from,
# and puts back what ``me`` left in flight from it on an earlier connection
# (nothing is being handled while a consumer starts consuming).
_REGISTER_QUEUE = (
    _RECLAIM_FN
    + """
local me, q, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local base = P .. me
register(me, lease)
redis.call('SADD', base .. '.queues', q)
local n = 0
while redis.call('LMOVE', base .. '.inflight.' .. q, q, 'LEFT', 'RIGHT') do n = n + 1 end
return n
"""
)

# Shared by the scripts that push: ARGV from ``first`` on holds Push
# triples (binding set or '', routing key or queue, payload); a binding set
# member is kombu's "<routing key><sep><pattern><sep><queue>". A direct
# exchange pushes to every queue bound with exactly the routing key, once
# each (kombu's DirectExchange.lookup, done here). Returns pushes made.
_ROUTE_FN = """
local function route(sep, bindings, key, payload)
  if bindings == '' then
    redis.call('LPUSH', key, payload)
    return 1
  end
  local seen, n = {}, 0
  for _, m in ipairs(redis.call('SMEMBERS', bindings)) do
    local a = string.find(m, sep, 1, true)
    if a and string.sub(m, 1, a - 1) == key then
      local b = string.find(m, sep, a + #sep, true)
      local q = b and string.sub(m, b + #sep)
      if q and not seen[q] then
        seen[q] = true
        redis.call('LPUSH', q, payload)
        n = n + 1
      end
    end
  end
  return n
end
local function route_all(sep, first)
  local n = 0
  for i = first, #ARGV, 3 do n = n + route(sep, ARGV[i], ARGV[i + 1], ARGV[i + 2]) end
  return n
end
"""

# KEYS: in-flight list, settle token; ARGV: the message as taken, token TTL
# (ms), the taker's nonce, binding separator, Push triples. 1: settled now
# (pushed), 2: settled earlier by this same taker (a retry after a lost
# answer), 0: not ours any more (reclaimed, possibly settled by the consumer
# that got it next; or a copy of a message another taker settled: removed).
_SETTLE = (
    _ROUTE_FN
    + """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= ARGV[3] then return 0 end
  route_all(ARGV[4], 5)
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
  return 1
end
if redis.call('GET', KEYS[2]) == ARGV[3] then return 2 end
return 0
"""
)

# ARGV: binding separator, Push triples. Pushes them in order, atomically.
_PUBLISH = (
    _ROUTE_FN
    + """
return route_all(ARGV[1], 2)
"""
)

# KEYS: in-flight list, queue; ARGV: the message as taken. Back at the head.
_RESTORE_ONE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"""

# KEYS: queue, in-flight list; ARGV: how many to take, then messages (as
# taken) to settle first. A private queue's consumer settles what it handled
# with its next take: nobody else takes from that queue, so no fencing.
# Returns the messages taken, oldest first.
_TAKE = """
for i = 2, #ARGV do redis.call('LREM', KEYS[2], 1, ARGV[i]) end
local taken = {}
for i = 1, tonumber(ARGV[1]) do
  local m = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not m then break end
  taken[i] = m
end
return taken
"""

_SCRIPTS = {
    "renew": _RENEW,
    "reclaim": _RECLAIM,
    "register_queue": _REGISTER_QUEUE,
    "settle": _SETTLE,
    "restore_one": _RESTORE_ONE,
    "publish": _PUBLISH,
    "take": _TAKE,
}


def _script(client: Any, name: str) -> Any:
    """The registered script ``name`` for ``client`` (cached on the client)."""
    cache = client.__dict__.setdefault("_flowengine_scripts", {})
    script = cache.get(name)
    if script is None:
        script = cache[name] = client.register_script(_SCRIPTS[name])
    return script


def renew(client: Any, consumer: str, lease_ms: int, reclaim: bool) -> tuple[int, bool]:
    """Renew ``consumer``'s lease; with ``reclaim``, put back what dead consumers held.

    Returns (messages put back, whether ``consumer`` was not registered).
    """
    back, fresh = _script(client, "renew")(
        args=[consumer, lease_ms, "1" if reclaim else "0", SUSPECT_EXTRA_MS, RECLAIMED_KEEP_MS]
    )
    return int(back), bool(int(fresh))


def retire(client: Any, consumer: str) -> int:
    """``consumer`` stops: put back what it holds, delete its private queues, unregister."""
    return int(_script(client, "reclaim")(args=[consumer, 0]))


def reclaim(client: Any, consumer: str) -> int:
    """Treat ``consumer`` as dead now: what a lapsed lease leads to, without the wait."""
    return int(_script(client, "reclaim")(args=[consumer, RECLAIMED_KEEP_MS]))


def register_queue(client: Any, consumer: str, queue: str, lease_ms: int) -> int:
    """``consumer`` starts taking from ``queue``; returns how many stale holdings went back."""
    return int(_script(client, "register_queue")(args=[consumer, queue, lease_ms]))


def mark_private(client: Any, consumer: str, queue: str, bindings: list[tuple[str, str]]) -> None:
    """Delete ``queue`` and remove ``bindings`` ((set key, member) pairs) with ``consumer``."""
    base = f"{CONSUMER_PREFIX}{consumer}"
    with client.pipeline() as pipe:
        pipe.sadd(f"{base}.private", queue)
        for set_key, member in bindings:
            pipe.sadd(f"{base}.bindings", f"{set_key}\0{member}")
        pipe.execute()


def _push_args(pushes: Sequence[Push | tuple[str, bytes]]) -> list[Any]:
    """Push triples as script arguments; a (queue, payload) pair pushes to the queue."""
    args: list[Any] = []
    for push in pushes:
        if isinstance(push, Push):
            args.extend(push)
        else:
            queue, payload = push
            args.extend(("", queue, payload))
    return args


def settle(
    client: Any,
    inflight: str,
    raw: bytes,
    delivery_tag: str,
    nonce: str,
    pushes: Sequence[Push | tuple[str, bytes]],
    queue: str = "",
) -> bool:
    """Remove a held message and make ``pushes`` (Push, or (queue, payload)) atomically.

    ``nonce`` is drawn when the message was taken; ``queue`` is where it was
    taken from. False when the message is no longer held by us (another
    consumer got it), or another copy of it was settled first.
    """
    keys = [inflight, settle_token_key(delivery_tag, queue)]
    args = [raw, SETTLE_TOKEN_TTL_MS, nonce, BINDING_SEP, *_push_args(pushes)]
    return int(_script(client, "settle")(keys=keys, args=args)) != 0


def publish(client: Any, pushes: Sequence[Push | tuple[str, bytes]]) -> int:
    """Make ``pushes`` in order, atomically, in one round trip; how many pushes were made."""
    return int(_script(client, "publish")(args=[BINDING_SEP, *_push_args(pushes)]))


def restore_one(client: Any, inflight: str, queue: str, raw: bytes) -> bool:
    """Put a held message back at the head of ``queue``; False if it was not held."""
    return int(_script(client, "restore_one")(keys=[inflight, queue], args=[raw])) == 1


def take(
    client: Any, queue: str, inflight: str, limit: int, settled: Sequence[bytes] = ()
) -> list[bytes]:
    """Remove ``settled`` from ``inflight``, then move up to ``limit`` messages there.

    One round trip for a private queue's consumer: what it handled since its
    last take leaves its in-flight list, and what waits comes in (oldest first).
    """
    return list(_script(client, "take")(keys=[queue, inflight], args=[limit, *settled]))
