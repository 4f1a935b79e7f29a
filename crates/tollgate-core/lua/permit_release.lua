-- Give back a holder's permits (compare-and-remove), or take a waiter's
-- ticket out of a fair queue, and tell waiters.
-- KEYS[1]: the holders. KEYS[2]: the token's release marker (the holders key
-- + ':released:' + token, same hash tag). KEYS[3]: the holder's description
-- (permit_acquire.lua). Fair names also pass KEYS[4] (queue), KEYS[5]
-- (tickets). ARGV[1]: the owner token or ticket.
-- ARGV[2]: the weight. ARGV[3]: the release channel. ARGV[4]: the marker's
-- TTL in ms.
-- Returns 1 when the token held live permits, now removed by this call or
-- by an earlier run of it whose reply was lost; 0 otherwise (expired, never
-- held): other holders' permits are left alone.
--
-- Idempotent per token, as the lock's release: removing permits leaves a
-- short-lived marker (one SET PX) that a replay finds. A ticket taken out of
-- the queue, or an expired holder, leaves none.
local weight = ARGV[2] + 0
-- Expired permits are no longer anyone's: purged first, so releasing one
-- reports "not held" (as the twin and the lock's release do).
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t[1] * 1000000 + t[2])
local removed = 0
if weight == 1 then
  removed = redis.call('ZREM', KEYS[1], ARGV[1])
else
  for i = 1, weight do
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[1] .. '#' .. i)
  end
end
local dequeued = 0
if KEYS[4] then
  dequeued = redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
end
if removed > 0 or dequeued > 0 then
  redis.call('PUBLISH', ARGV[3], 'released')
end
if removed > 0 then
  redis.call('DEL', KEYS[3])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
  return 1
end
return redis.call('EXISTS', KEYS[2])
