-- Extend a holder's permits if they are still its own and unexpired.
-- KEYS[1]: the holders. KEYS[2]: the holder's description (it lives as long
-- as the permits: see permit_acquire.lua). ARGV[1]: the owner token.
-- ARGV[2]: the weight. ARGV[3]: the new TTL in ms.
-- Returns 1 when extended, 0 when the permits are no longer ours.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local weight = ARGV[2] + 0
local function member(i)
  if weight == 1 then return ARGV[1] end
  return ARGV[1] .. '#' .. i
end
local score = redis.call('ZSCORE', KEYS[1], member(1))
if not score or score + 0 <= now then return 0 end
local expiry = now + (ARGV[3] + 0) * 1000
for i = 1, weight do
  redis.call('ZADD', KEYS[1], 'XX', expiry, member(i))
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if redis.call('PTTL', KEYS[1]) < ARGV[3] + 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
