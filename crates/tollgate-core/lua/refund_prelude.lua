-- Prologue of the five refund scripts, after rate_prelude.lua (`now`, `cost`,
-- `n` = #KEYS). A refund gives back what one admitted check took.
-- KEYS[1]: the refund's marker: a refund is applied at most once per charge.
-- KEYS[2..n]: one key per quota, as the check's, all sharing one hash tag.
-- ARGV[3]: the charge's id (hex; the log's member prefix).
-- ARGV[4]: the instant the check decided at (µs).
-- ARGV[5]: how long after it a refund can still matter (µs): the longest
-- quota's span. ARGV[4+2i], ARGV[5+2i]: quota i's parameters, as the check's.
-- Then, for a token bucket or GCRA, each quota's own span (µs), in order.
-- Then, for a token bucket or GCRA, each quota's own span (µs), in order.
-- Returns 1 when given back, 0 when already given back or too late to matter.
local at = ARGV[4] + 0
local left = at + ARGV[5] - now
if left <= 0 then return 0 end
-- The marker lives as long as the refund could matter, so a replay after a
-- lost reply finds it and gives nothing twice.
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', string.format('%d', math.ceil(left / 1000))) then
  return 0
end
-- Rewrites a window's value under its current TTL (KEEPTTL needs Redis 6).
local function rewrite(key, value)
  local pttl = redis.call('PTTL', key)
  if pttl > 0 then redis.call('SET', key, value, 'PX', pttl) end
end
