-- Redlock: raise one instance's fence to the value the quorum agreed on, so
-- the next quorum (which shares at least one instance with this one) starts
-- above it, whatever the instances' clocks say.
-- KEYS[1]: the lock key. KEYS[2]: its fence key. ARGV[1]: the owner token.
-- ARGV[2]: the fence. ARGV[3]: the fence key's TTL in ms.
-- Returns 1 when the stored fence is now >= ARGV[2] while the lock is ours.
-- Ours: the value is the token, or starts with `token|` (lock_acquire.lua).
local v = redis.call('GET', KEYS[1])
if not (v and (v == ARGV[1] or string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|')) then
  return 0
end
local prev = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local fence = tonumber(ARGV[2])
if fence > prev then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
return 1
