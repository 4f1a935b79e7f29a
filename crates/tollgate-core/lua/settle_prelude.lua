-- Prologue of the five settle scripts. The loader puts before it
-- rate_args.lua (`now`, `cost` = the units the check took, `n` = #KEYS),
-- rate_prelude.lua and the algorithm's check script wrapped as
-- `local function check(KEYS, ARGV)` (run by settle_reply.lua); after it,
-- the algorithm's `<alg>_settle.lua`, then settle_reply.lua.
-- A settle corrects what one admitted check took to `actual` units, at most
-- once per charge; a refund is a settle to 0.
-- KEYS[1]: the marker: one settle or refund per charge.
-- KEYS[2..n-1]: one key per quota, as the check's, all sharing one hash tag.
-- KEYS[n]: the subject's reset stamp (rate_reset.lua): a charge taken at or
-- before a reset is not settled — its units went with the reset, and giving
-- them back would add them to the fresh quota.
-- ARGV[3]: the charge's id (hex; the log's member prefix).
-- ARGV[4]: the instant the check decided at (µs).
-- ARGV[5]: how long after it the settle may still be applied (µs).
-- ARGV[6]: actual units. ARGV[7]: the most debt per quota, or '' for each
-- quota's own limit or burst. ARGV[8]: how long after the check the marker
-- lives (µs): the longest horizon of either direction, so that a settle
-- refused as a replay stays refused whichever way a later one goes.
-- ARGV[7+2i], ARGV[8+2i]: quota i's parameters, as the check's.
-- ARGV[9+2q]: when the charge's units were taken (µs): ARGV[4] less a
-- reservation's wait for its slot.
-- Then, for a give-back on a token bucket or GCRA, each quota's own span
-- (µs), in order.
local at, q = ARGV[4] + 0, n - 2
local delta = ARGV[6] - cost
-- Units to give back (under the estimate) or to owe (over it).
local give, owe = math.max(-delta, 0), math.max(delta, 0)
local applied = false
-- A charge taken at or before the subject's last reset went with it.
local function before_reset()
  local reset = tonumber(redis.call('GET', KEYS[n]) or '')
  return reset ~= nil and ARGV[9 + 2 * q] + 0 <= reset
end
if delta ~= 0 and at + ARGV[5] > now and not before_reset() then
  -- The marker lives as long as any settle of the charge could apply, so
  -- a replay after a lost reply finds it and changes nothing twice.
  applied = redis.call('SET', KEYS[1], '1', 'NX', 'PX',
    string.format('%d', math.ceil((at + ARGV[8] - now) / 1000))) and true or false
end
-- The most debt quota i may carry (units).
local function debt_of(i)
  if ARGV[7] ~= '' then return ARGV[7] + 0 end
  return ARGV[7 + 2 * i] + 0
end
-- A bucket's give-back on quota i, in units of 1/per µs of its instant: at
-- most what the schedule still holds of the charge (its own span past `at`
-- is when the charge would have refilled; the part time has refilled
-- already was used, and giving it back too would admit it twice); none
-- once the span has passed.
local function still_held(i, give, interval, per)
  local span = ARGV[9 + 2 * q + i] or ARGV[5]
  local left = at + span - now
  if left <= 0 then return 0 end
  return math.min(give * interval, left * per)
end
-- The furthest ahead of now a debt may move a bucket's instant: 2^40 µs
-- (about 12 days), and at most 2^51 units of 1/per µs, so that a stored
-- instant is read back (stored_instant reads none 2^52 units or more from
-- now, and a quota whose unit is a small fraction of a µs reaches that
-- well before 2^40 µs).
local function most_ahead(per)
  return math.min(1099511627776 * per, 2251799813685248)
end
-- Rewrites a window's value under its current TTL (KEEPTTL needs Redis 6).
local function rewrite(key, value)
  local pttl = redis.call('PTTL', key)
  if pttl > 0 then redis.call('SET', key, value, 'PX', pttl) end
end
