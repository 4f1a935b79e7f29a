-- Extend a lock if it is still ours (compare-and-pexpire).
-- KEYS[1]: the lock key. ARGV[1]: the owner token. ARGV[2]: the new TTL in ms.
-- Returns 1 when extended, 0 when the lock is no longer ours.
-- Ours: the value is the token, or starts with `token|` (a holder's
-- description follows it; see lock_acquire.lua).
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|') then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
