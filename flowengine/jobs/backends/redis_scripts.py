"""The Lua scripts of the Redis jobboard: each board operation is one atomic script.

Redis runs a script with nothing else in between, so a claim cannot race
another claim, and consume cannot race the lease running out. Time comes
from the server (``TIME``), never from a client. Every script returns a
list whose first item is a status word the Python side maps to a result or
an exception.

Keys (``<ns>`` is the board's namespace):

===================================  ================================================
``<ns>:listed``                      hash uuid -> posting JSON (the listed jobs; not
                                     TaskFlow's ``listings``, whose undecodable
                                     postings TaskFlow's board deletes)
``<ns>:trash``, ``<ns>:dead``        hash uuid -> posting JSON (parked jobs)
``<ns>:state:<uuid>``                hash: sequence, attempts, token, owner, not_before (ms)
``<ns>:owner:<uuid>``                hash who, token; expires with the lease (PEXPIRE)
``<ns>:outcome:<uuid>``              outcome JSON, expires after ``outcome_ttl_s``
``<ns>:done:<uuid>``                 a consumed job's posting, kept as long as its outcome
``<ns>:sequence``, ``<ns>:token``    counters: posting order; fencing tokens
``<ns>:events``                      pub/sub channel of board events
===================================  ================================================
"""

from __future__ import annotations

__all__ = ["CLAIM", "CONSUME_AND_CLAIM", "FINISH", "POST", "RENEW", "REQUEUE"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: KEYS listed, sequence, state; ARGV uuid, posting, channel
#: -> {'ok', seq} | {'exists', posting, seq}
POST = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return {'exists', redis.call('HGET', KEYS[1], ARGV[1]),
          redis.call('HGET', KEYS[3], 'sequence') or '0'}
end
local seq = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'sequence', seq, 'attempts', 0, 'token', 0, 'not_before', 0)
redis.call('PUBLISH', ARGV[3], 'posted ' .. ARGV[1])
return {'ok', tostring(seq)}
"""

#: The body of CLAIM (run after _NOW, which sets ``now``).
_CLAIM_BODY = """
local posting = redis.call('HGET', KEYS[1], ARGV[1])
if not posting then return {'unknown'} end
local holder = redis.call('HGET', KEYS[3], 'who')
if holder then return {'claimed', holder} end
local nb = tonumber(redis.call('HGET', KEYS[2], 'not_before') or '0')
if nb > now then return {'backoff', tostring(nb - now)} end
local attempts = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')
if attempts >= tonumber(ARGV[4]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[5], ARGV[1], posting)
  redis.call('HDEL', KEYS[2], 'owner')
  local rec = {uuid=ARGV[1], outcome='dead', token=tonumber(redis.call('HGET', KEYS[2], 'token')
               or '0'), attempts=attempts, at=now / 1000, reason='too many attempts'}
  redis.call('SET', KEYS[6], cjson.encode(rec), 'PX', ARGV[5])
  redis.call('PUBLISH', ARGV[6], 'done ' .. ARGV[1] .. ' dead')
  return {'dead', tostring(attempts)}
end
local token = redis.call('INCR', KEYS[4])
attempts = attempts + 1
redis.call('HSET', KEYS[2], 'attempts', attempts, 'token', token, 'owner', ARGV[2],
           'not_before', 0)
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'who', ARGV[2], 'token', token)
redis.call('PEXPIRE', KEYS[3], ARGV[3])
redis.call('PUBLISH', ARGV[6], 'claimed ' .. ARGV[1])
return {'ok', tostring(token), tostring(attempts)}
"""

#: KEYS listed, state, owner, token counter, dead, outcome;
#: ARGV uuid, who, lease_ms, max_attempts, outcome_ttl_ms, channel
CLAIM = _NOW + _CLAIM_BODY

#: KEYS owner_1, state_1, ..., owner_n, state_n, listed;
#: ARGV lease_ms, uuid_1, token_1, ... -> the uuids lost
RENEW = """
local lost = {}
local listings = KEYS[#KEYS]
for i = 1, (#KEYS - 1) / 2 do
  local okey, skey = KEYS[2 * i - 1], KEYS[2 * i]
  local uuid, token = ARGV[2 * i], ARGV[2 * i + 1]
  local current = redis.call('HGET', okey, 'token')
  if current == token then
    redis.call('PEXPIRE', okey, ARGV[1])
  elseif (not current) and redis.call('HGET', skey, 'token') == token
      and redis.call('HEXISTS', skey, 'owner') == 1
      and redis.call('HEXISTS', listings, uuid) == 1 then
    -- The lease ran out but nobody claimed the job since: the token still rules it.
    redis.call('HSET', okey, 'who', redis.call('HGET', skey, 'owner'), 'token', token)
    redis.call('PEXPIRE', okey, ARGV[1])
  else
    table.insert(lost, uuid)
  end
end
return lost
"""

#: The body of FINISH (run after _NOW, which sets ``now``).
_FINISH_BODY = """
local posting = redis.call('HGET', KEYS[1], ARGV[1])
if not posting then return {'unknown'} end
local owner = redis.call('HGET', KEYS[2], 'owner')
if not owner then return {'unclaimed'} end
local token = redis.call('HGET', KEYS[2], 'token') or '0'
if token ~= ARGV[3] then return {'lost', token, owner} end
if owner ~= ARGV[2] then return {'owner', owner} end
redis.call('DEL', KEYS[3])
redis.call('HDEL', KEYS[2], 'owner')
local attempts = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')
local action = ARGV[4]
if action == 'abandon' then
  if attempts > 0 then redis.call('HSET', KEYS[2], 'attempts', attempts - 1) end
  redis.call('PUBLISH', ARGV[10], 'released ' .. ARGV[1])
  return {'released'}
end
if action == 'fail' and attempts < tonumber(ARGV[8]) then
  redis.call('HSET', KEYS[2], 'not_before', now + tonumber(ARGV[7]))
  redis.call('PUBLISH', ARGV[10], 'released ' .. ARGV[1])
  return {'released'}
end
local outcome = ARGV[5]
redis.call('HDEL', KEYS[1], ARGV[1])
if action == 'trash' then
  outcome = 'trashed'
  redis.call('HSET', KEYS[5], ARGV[1], posting)
elseif action == 'fail' then
  outcome = 'dead'
  redis.call('HSET', KEYS[6], ARGV[1], posting)
else
  redis.call('PEXPIRE', KEYS[2], ARGV[9])
  redis.call('SET', KEYS[7], posting, 'PX', ARGV[9])
end
local rec = {uuid=ARGV[1], outcome=outcome, who=ARGV[2], token=tonumber(token),
             attempts=attempts, at=now / 1000}
if ARGV[6] ~= '' then rec['reason'] = ARGV[6] end
local encoded = cjson.encode(rec)
redis.call('SET', KEYS[4], encoded, 'PX', ARGV[9])
redis.call('PUBLISH', ARGV[10], 'done ' .. ARGV[1] .. ' ' .. outcome)
return {'done', encoded}
"""

#: KEYS listed, state, owner, outcome, trash, dead, done;
#: ARGV uuid, who, token, action, outcome, reason, backoff_ms, max_attempts,
#: outcome_ttl_ms, channel
FINISH = _NOW + _FINISH_BODY

#: FINISH's KEYS and ARGV (action 'consume'), then CLAIM's for the next job:
#: one round trip for a blocking conductor's consume and its next claim.
#: FINISH's reply, with CLAIM's token and attempts appended when the next
#: job was claimed; it is claimed only where CLAIM would grant it (a job
#: due for the dead letter is left to a claim of its own, which parks it).
#: The bodies run as functions whose parameters shadow KEYS and ARGV.
CONSUME_AND_CLAIM = (
    _NOW
    + "local function finish(KEYS, ARGV)\n"
    + _FINISH_BODY
    + "end\nlocal function claim(KEYS, ARGV)\n"
    + _CLAIM_BODY
    + """end
local function slice(list, first, last)
  local out = {}
  for i = first, last do out[#out + 1] = list[i] end
  return out
end
local done = finish(slice(KEYS, 1, 7), slice(ARGV, 1, 10))
if done[1] ~= 'done' then return done end
local keys, args = slice(KEYS, 8, 13), slice(ARGV, 11, 16)
local attempts = tonumber(redis.call('HGET', keys[2], 'attempts') or '0')
if attempts >= tonumber(args[4]) then return done end
local claimed = claim(keys, args)
if claimed[1] ~= 'ok' then return done end
return {'done', done[2], claimed[2], claimed[3]}
"""
)

#: KEYS listed, trash, dead, state, outcome; ARGV uuid, channel
REQUEUE = """
local from = KEYS[2]
local posting = redis.call('HGET', from, ARGV[1])
if not posting then
  from = KEYS[3]
  posting = redis.call('HGET', from, ARGV[1])
end
if not posting then return {'unknown'} end
redis.call('HDEL', from, ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], posting)
redis.call('HSET', KEYS[4], 'attempts', 0, 'not_before', 0)
redis.call('HDEL', KEYS[4], 'owner')
redis.call('PERSIST', KEYS[4])
redis.call('DEL', KEYS[5])
redis.call('PUBLISH', ARGV[2], 'posted ' .. ARGV[1])
return {'ok'}
"""
