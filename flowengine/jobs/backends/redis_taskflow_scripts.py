"""Lua scripts of the Redis board in TaskFlow's layout (``compat='taskflow'``).

Each changes TaskFlow's keys exactly as TaskFlow's own scripts would, so a
TaskFlow 6.5 board reading them sees an ordinary posting, claim, abandon,
consume or trash, and adds flowengine's claim facts in keys TaskFlow never
reads. Keys (``<ns>`` is TaskFlow's namespace, ``taskflow`` by default):

=====================================  =============================================
TaskFlow's keys
``<ns>:listings``                      hash uuid -> posting (msgpack)
``<ns>:trash``                         hash uuid -> posting of trashed jobs
``<ns>:sequence``                      posting counter
``<ns>:<uuid>.owned``                  the claim: the owner's name; flowengine's
                                       claims expire with their lease (PEXPIRE),
                                       TaskFlow's claims do not
``<ns>:<uuid>.last_modified``          when a claim last changed (msgpack datetime)
flowengine's additions (TaskFlow ignores them)
``<ns>:<uuid>.flowengine``             hash: token, attempts, owner, not_before (ms)
``<ns>:flowengine.token``              fencing token counter
``<ns>:flowengine.dead``               hash uuid -> posting (dead letter)
``<ns>:<uuid>.outcome``, ``.done``     outcome JSON and consumed posting, with a TTL
``<ns>:flowengine.events``             pub/sub channel of board events
=====================================  =============================================

A claim is TaskFlow's (``.owned`` holds the name) plus a token in
``.flowengine``; it is flowengine's own while ``.flowengine``'s ``owner``
is the name in ``.owned``. A TaskFlow conductor claiming after a
flowengine lease ran out writes its name there, which fences the old
claimer out (its finish is refused) whatever the token says.
"""

from __future__ import annotations

from flowengine.jobs.backends import redis_scripts

__all__ = ["CLAIM", "FINISH", "POST", "RENEW", "REQUEUE"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: KEYS listings, side; ARGV uuid, posting blob, channel -> {'ok'} | {'exists'}
POST = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return {'exists'} end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[3], 'posted ' .. ARGV[1])
return {'ok'}
"""

#: KEYS listings, owned, last_modified, side, token counter, dead, outcome;
#: ARGV uuid, who, lease_ms, max_attempts, outcome_ttl_ms, channel, now blob
CLAIM = (
    _NOW
    + """
local posting = redis.call('HGET', KEYS[1], ARGV[1])
if not posting then return {'unknown'} end
local holder = redis.call('GET', KEYS[2])
if holder then return {'claimed', holder} end
local nb = tonumber(redis.call('HGET', KEYS[4], 'not_before') or '0')
if nb > now then return {'backoff', tostring(nb - now)} end
local attempts = tonumber(redis.call('HGET', KEYS[4], 'attempts') or '0')
if attempts >= tonumber(ARGV[4]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[6], ARGV[1], posting)
  redis.call('DEL', KEYS[3])
  redis.call('HDEL', KEYS[4], 'owner')
  local rec = {uuid=ARGV[1], outcome='dead', token=tonumber(redis.call('HGET', KEYS[4], 'token')
               or '0'), attempts=attempts, at=now / 1000, reason='too many attempts'}
  redis.call('SET', KEYS[7], cjson.encode(rec), 'PX', ARGV[5])
  redis.call('PUBLISH', ARGV[6], 'done ' .. ARGV[1] .. ' dead')
  return {'dead', tostring(attempts)}
end
local token = redis.call('INCR', KEYS[5])
attempts = attempts + 1
redis.call('HSET', KEYS[4], 'attempts', attempts, 'token', token, 'owner', ARGV[2],
           'not_before', 0)
-- A job a TaskFlow conductor consumes keeps these facts until they expire.
redis.call('PEXPIRE', KEYS[4], ARGV[5])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[7])
return {'ok', tostring(token), tostring(attempts)}
"""
)

#: KEYS owned_1, side_1, ..., owned_n, side_n, listings;
#: ARGV lease_ms, uuid_1, token_1, ... -> the uuids lost
RENEW = """
local lost = {}
local listings = KEYS[#KEYS]
for i = 1, (#KEYS - 1) / 2 do
  local okey, skey = KEYS[2 * i - 1], KEYS[2 * i]
  local uuid, token = ARGV[2 * i], ARGV[2 * i + 1]
  local owner = redis.call('HGET', skey, 'owner')
  local holder = redis.call('GET', okey)
  local ours = owner and redis.call('HGET', skey, 'token') == token
  if ours and holder == owner then
    redis.call('PEXPIRE', okey, ARGV[1])
  elseif ours and (not holder) and redis.call('HEXISTS', listings, uuid) == 1 then
    -- The lease ran out but nobody claimed the job since: the token still rules it.
    redis.call('SET', okey, owner, 'PX', ARGV[1])
  else
    table.insert(lost, uuid)
  end
end
return lost
"""

#: KEYS listings, owned, last_modified, side, outcome, trash, dead, done;
#: ARGV uuid, who, token, action, outcome, reason, backoff_ms, max_attempts,
#: outcome_ttl_ms, channel, now blob
FINISH = (
    _NOW
    + """
local posting = redis.call('HGET', KEYS[1], ARGV[1])
if not posting then return {'unknown'} end
local owner = redis.call('HGET', KEYS[4], 'owner')
local holder = redis.call('GET', KEYS[2])
if not owner then
  if holder then return {'owner', holder} end
  return {'unclaimed'}
end
local token = redis.call('HGET', KEYS[4], 'token') or '0'
if token ~= ARGV[3] then return {'lost', token, holder or owner} end
if holder and holder ~= owner then return {'lost', 'a TaskFlow claim', holder} end
if owner ~= ARGV[2] then return {'owner', owner} end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[4], 'owner')
redis.call('SET', KEYS[3], ARGV[11])
local attempts = tonumber(redis.call('HGET', KEYS[4], 'attempts') or '0')
local action = ARGV[4]
if action == 'abandon' then
  if attempts > 0 then redis.call('HSET', KEYS[4], 'attempts', attempts - 1) end
  redis.call('PUBLISH', ARGV[10], 'released ' .. ARGV[1])
  return {'released'}
end
if action == 'fail' and attempts < tonumber(ARGV[8]) then
  redis.call('HSET', KEYS[4], 'not_before', now + tonumber(ARGV[7]))
  redis.call('PUBLISH', ARGV[10], 'released ' .. ARGV[1])
  return {'released'}
end
local outcome = ARGV[5]
redis.call('HDEL', KEYS[1], ARGV[1])
if action == 'trash' then
  outcome = 'trashed'
  redis.call('HSET', KEYS[6], ARGV[1], posting)
elseif action == 'fail' then
  outcome = 'dead'
  redis.call('HSET', KEYS[7], ARGV[1], posting)
else
  redis.call('DEL', KEYS[3])
  redis.call('SET', KEYS[8], posting, 'PX', ARGV[9])
end
redis.call('PEXPIRE', KEYS[4], ARGV[9])
local rec = {uuid=ARGV[1], outcome=outcome, who=ARGV[2], token=tonumber(token),
             attempts=attempts, at=now / 1000}
if ARGV[6] ~= '' then rec['reason'] = ARGV[6] end
local encoded = cjson.encode(rec)
redis.call('SET', KEYS[5], encoded, 'PX', ARGV[9])
redis.call('PUBLISH', ARGV[10], 'done ' .. ARGV[1] .. ' ' .. outcome)
return {'done', encoded}
"""
)

#: KEYS listings, trash, dead, side, outcome; ARGV uuid, channel: the same
#: script as the board's own layout (its keys play the same parts).
REQUEUE = redis_scripts.REQUEUE
