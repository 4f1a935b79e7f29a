-- Acquire a fenced lock.
-- KEYS[1]: the lock key. KEYS[2]: its fence key (same hash tag, so same slot).
-- ARGV[1]: the owner token (128-bit, hex). ARGV[2]: the lease TTL in ms.
-- ARGV[3]: the fence key's TTL in ms (refreshed on every acquire).
-- ARGV[4]: who acquires (`host:pid`).
-- Returns {1, fence} when acquired, or {0, pttl_ms} when someone else holds it.
--
-- The lock's value is `token|fence|since_ms|holder`: the owner token, then
-- who holds it since when (server time), so an operator's listing needs
-- nothing but the store. The other lock scripts compare the token part.
--
-- The fence is max(previous + 1, server time in µs): strictly increasing per
-- lock name, and still increasing after Redis lost the fence key (restart
-- without persistence, failover to a lagging replica, expiry), as long as the
-- server clock does not step back. Integers stay below 2^53: exact in Lua.
--
-- Idempotent: a client that retries this script after a connection error
-- (redis-rs's cluster connection does) may find the lock it set the first
-- time. Tokens are fresh per attempt, so a lock holding ARGV[1] is that
-- attempt's own: it is reported as acquired, with the fence it got (the lock
-- key's TTL is left as the first run set it).
local function fence_now(prev)
  local t = redis.call('TIME')
  local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local since = math.floor(fence / 1000)
  if prev + 1 > fence then fence = prev + 1 end
  fence = string.format('%d', fence)
  redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
  return fence, string.format('%d', since)
end

local held = redis.call('GET', KEYS[1])
if not held then
  local fence, since = fence_now(tonumber(redis.call('GET', KEYS[2]) or '0') or 0)
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. fence .. '|' .. since .. '|' .. ARGV[4],
    'PX', ARGV[2])
  return {1, tonumber(fence)}
end
if held == ARGV[1] or string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  local stored = tonumber(redis.call('GET', KEYS[2]) or '')
  if stored and stored > 0 then
    return {1, stored}
  end
  -- The fence key is gone (it cannot expire before the lock in practice):
  -- a new fence from the server time is still above every earlier one.
  return {1, tonumber((fence_now(0)))}
end
return {0, redis.call('PTTL', KEYS[1])}
