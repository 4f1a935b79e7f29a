-- The token bucket's step in a lean batch (rate_lean.lua): token_bucket.lua's
-- single-quota check without a wait. ARGV[2], ARGV[3]: capacity and refill
-- interval. The state is the empty instant (units of 1/per µs after now,
-- ≥ -capacity × interval).
local interval, per = interval_of(ARGV[3])
local full = (ARGV[2] + 0) * interval
local function step(key, cost, empty, keep)
  empty = empty or bucket_empty(key, per, full)
  if math.floor(-empty / interval) < cost then return empty end
  local after = empty + cost * interval
  -- Within ±2^52 it reads back as written (stored_instant's bound).
  if keep and after < 4503599627370496 and after > -4503599627370496 then return empty, after end
  bucket_store(key, after, per, full, 0)
  return empty, after, true
end
local function write(key, after)
  bucket_store(key, after, per, full, 0)
end
