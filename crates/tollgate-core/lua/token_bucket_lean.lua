-- The token bucket's step in a lean batch (rate_lean.lua): token_bucket.lua's
-- single-quota check without a wait. ARGV[2], ARGV[3]: capacity and refill
-- interval. Returns the empty instant it decided from (units of 1/per µs
-- after now, ≥ -capacity × interval) and whether it admitted the check.
local interval, per = interval_of(ARGV[3])
local full = (ARGV[2] + 0) * interval
local function step(key, cost)
  local empty = bucket_empty(key, per, full)
  if math.floor(-empty / interval) < cost then return empty, false end
  bucket_store(key, empty + cost * interval, per, full, 0)
  return empty, true
end
