-- Acquire a fenced lock.
-- KEYS[1]: the lock key. KEYS[2]: its fence key (same hash tag, so same slot).
-- ARGV[1]: the owner token (128-bit, hex). ARGV[2]: the lease TTL in ms.
-- ARGV[3]: the fence key's TTL in ms (long, refreshed on every acquire).
-- Returns {1, fence} when acquired, or {0, pttl_ms} when someone else holds it.
--
-- The fence is max(previous + 1, server time in µs): strictly increasing per
-- lock name, and still increasing after Redis lost the fence key (restart
-- without persistence, failover to a lagging replica, expiry), as long as the
-- server clock does not step back. Integers stay below 2^53: exact in Lua.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local prev = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  local fence = now
  if prev + 1 > fence then fence = prev + 1 end
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
