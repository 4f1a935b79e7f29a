-- Release a lock if it is still ours, and tell waiters.
-- KEYS[1]: the lock key. KEYS[2]: the token's release marker (the lock key
-- + ':released:' + token: same hash tag, so same slot). ARGV[1]: the owner
-- token. ARGV[2]: the release channel (plain PUBLISH: on a cluster it
-- reaches every node). ARGV[3]: the marker's TTL in ms.
-- Returns 1 when the lock was ours and is now deleted — by this call, or by
-- an earlier run of it whose reply was lost (a caller that retries after
-- a timeout, or a connection that sends again) — and 0 otherwise (expired, never
-- ours, or taken by someone else, whose lock is left alone).
--
-- Idempotent per token: a release leaves a short-lived marker (one SET PX),
-- so its replay finds the marker and reports the truth, "released", instead
-- of "not held". Only a token that released gets one: an expired lease
-- finds none.
-- Ours: the value is the token, or starts with `token|` (lock_acquire.lua).
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|') then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return redis.call('EXISTS', KEYS[2])
