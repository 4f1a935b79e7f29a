-- Break a lock, or every permit of a semaphore name, whoever holds it: an
-- operator's tool for a stuck holder.
-- KEYS[1]: the lock key, or a semaphore's holders (sorted set); each
-- holder's description key (`<KEYS[1]>:holder:<token>`) shares its hash tag.
-- ARGV[1]: the release channel.
-- Returns how many holders were removed (0 or 1 for a lock).
--
-- The fence key stays, so the next holder's fence is still above every
-- earlier one. Waiters are told at once; a fair name's queue keeps its
-- order. A broken holder finds out at its next renewal, which fails, and
-- its release reports "not held" (no release marker is left for it).
local kind = redis.call('TYPE', KEYS[1]).ok
local n = 0
if kind == 'string' then
  -- Only a lock's value (`token|fence|since_ms|holder`, lock_acquire.lua):
  -- a name that reaches another key (a block, a rate state) breaks nothing.
  if string.find(redis.call('GET', KEYS[1]), '^%x+|%d+|%d+|') then
    redis.call('DEL', KEYS[1])
    n = 1
  end
elseif kind == 'zset' then
  local t = redis.call('TIME')
  local after = string.format('(%d', t[1] * 1000000 + t[2])
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], after, '+inf')
  local seen = {}
  for i = 1, #live do
    local token = string.match(live[i], '^(.*)#%d+$') or live[i]
    if not seen[token] then
      seen[token] = true
      n = n + 1
      redis.call('DEL', KEYS[1] .. ':holder:' .. token)
    end
  end
  -- The live holders only: anything else in a sorted set is not a permit's.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], after, '+inf')
end
if n > 0 then
  redis.call('PUBLISH', ARGV[1], 'released')
end
return n
