-- The token bucket's step in a lean batch (rate_lean.lua): token_bucket.lua's
-- single-quota check without a wait. ARGV[2], ARGV[3]: capacity and refill
-- interval. Returns the empty instant it decided from (units of 1/per µs
-- after now, ≥ -capacity × interval).
local interval, per = interval_of(ARGV[3])
local full = (ARGV[2] + 0) * interval
local function step(key, cost)
  local empty = stored_instant(key, per) or -full
  if empty < -full then empty = -full end
  if math.floor(-empty / interval) >= cost then
    local after = empty + cost * interval
    local px = math.ceil(ceil_us(after + full, per) / 1000)
    if px < 1 then px = 1 end
    store(key, instant(after, per), string.format('%d', px))
  end
  return empty
end
