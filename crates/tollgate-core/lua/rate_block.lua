-- A subject an operator blocked is refused until the block ends, whatever
-- its quotas say. KEYS[n + 1], when given: the subject's block key; it is
-- a block while it lives (rate_block_set.lua sets it with a TTL: its PTTL
-- is the wait, on the server's own clock whatever clock the check uses).
-- Returns {-2, now, µs left}: blocked.
if KEYS[n + 1] then
  local left = redis.call('PTTL', KEYS[n + 1])
  if left > 0 then return {-2, now, left * 1000} end
end
